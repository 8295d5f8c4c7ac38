//! Feeds arbitrary bytes to a whole server connection: the handshake parser, the request
//! parser and checks, the byte-to-sector executor and the reply encoder. Any panic is a bug.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let _ = afa_serve::session::replay(input);
});
