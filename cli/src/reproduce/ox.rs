//! OX/OXBatch experiments. They run in `afa-ox`; the id is added here so every entry writes
//! the same JSON shape.

use super::{Entry, Reproduction};

pub const EXPERIMENTS: &[Entry] = &[
    (
        "ox-fig11",
        "OX Fig. 11: YCSB throughput of the batch and block interfaces with checkpoints and GC turned on one at a time (none, checkpoints only, GC only at 70% and 50% used), read- and write-heavy at host cache 20%, 50% and 80%",
        |q, s| ox("ox-fig11", q, s),
    ),
    (
        "ox-fig12",
        "OX Fig. 12: done records per MiB of host flush, block vs batch interface",
        |q, s| ox("ox-fig12", q, s),
    ),
    (
        "ox-fig13",
        "OX Fig. 13: YCSB throughput of the batch over the block interface at host cache 20%, 50% and 80%",
        |q, s| ox("ox-fig13", q, s),
    ),
    (
        "ox-table4",
        "OX Table 4: GC overhead and read amplification, block vs batch, host cache 20%",
        |q, s| ox("ox-table4", q, s),
    ),
    (
        "ox-fig14",
        "OX Fig. 14: YCSB throughput of the block host on a conventional SSD (the same flash, its FTL in firmware, on PCIe) against BwTree_Block and BwTree_Batch on OX, read- and write-heavy at 50% cache",
        |q, s| ox("ox-fig14", q, s),
    ),
    (
        "ox-fig15",
        "OX Fig. 15: the block host's durability work, write-heavy at 50% cache: throughput with checkpoints and LLAMA's cleaning over the non-durable configuration, the share of host CPU spent cleaning, and how steady each run's throughput is",
        |q, s| ox("ox-fig15", q, s),
    ),
];

fn ox(id: &str, quick: bool, seed: u64) -> Result<Reproduction, String> {
    let r = afa_ox::reproduce::reproduce(id, quick, seed)?;
    Ok(Reproduction {
        id: id.into(),
        unit: r.unit,
        paper: r.paper,
        measured: r.measured,
        context: std::collections::BTreeMap::new(),
    })
}
