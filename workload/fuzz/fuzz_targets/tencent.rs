//! Feeds arbitrary bytes to the tencent trace reader. A reader may refuse its input, but must
//! never panic; whatever it accepts must survive a round trip through the writer when the
//! writer can hold it.

#![no_main]

use afa_workload::trace::{read_trace, write_trace, TraceFormat};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let format = TraceFormat::Tencent;
    if let Ok(records) = read_trace(input, format, "fuzz") {
        let mut written = Vec::new();
        if write_trace(&records, format, &mut written).is_ok() {
            let again = read_trace(written.as_slice(), format, "round trip")
                .expect("what the writer writes, the reader reads");
            assert_eq!(again.len(), records.len());
        }
    }
});
