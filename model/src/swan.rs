//! SWAN's sizing model (ATC '19 §3.5): how many R-groups keep GC off the front-end, and how
//! wide an R-group must be to fill the network.
//!
//! An R-group returns to the front-end at the earliest `(N − 1) · S · (1 − u) · T_w` after it
//! left; cleaning it takes `S · (T_e + u · (T_r + T_w))`. GC never holds up the front-end when
//! the second is no longer than the first, which gives Equation 1:
//!
//! ```text
//! N ≥ T_e / T_w · 1 / (1 − u) + (T_r / T_w + 1) · u / (1 − u) + 1
//! ```
//!
//! with `T_w = t_w · B` and `T_r = t_r · B` the times to write and read a segment of `B`
//! blocks, `T_e` the time to erase one, and `u` the valid fraction of the segments cleaned,
//! related to the disk utilisation by `u_d = (u − 1) / ln u`.

use crate::{segment_utilisation_from_disk_utilisation, ModelError};

/// The device figures of Equation 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwanDevice {
    /// Time to erase a segment's flash blocks, in µs (T_e).
    pub erase_us: f64,
    /// Time to read one block, in µs (t_r).
    pub read_us: f64,
    /// Time to write one block, in µs (t_w).
    pub write_us: f64,
    /// Blocks per segment (B).
    pub blocks_per_segment: u32,
}

/// Equation 1's answer and the figures it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwanSizing {
    /// Segment utilisation u of the victims.
    pub segment_utilization: f64,
    /// Time to clean one segment, `T_e + u (T_r + T_w)`, in µs.
    pub clean_segment_us: f64,
    /// Time the front-end takes to consume the free space one segment's cleaning yields,
    /// `(1 − u) T_w`, in µs.
    pub consume_segment_us: f64,
    /// The minimum number of R-groups N (real; round up to build it).
    pub min_groups: f64,
}

fn check_positive(name: &'static str, v: f64) -> Result<(), ModelError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ModelError::InvalidParameter(name, v))
    }
}

/// Equation 1 for segment utilisation `u` (strictly between 0 and 1).
pub fn min_groups(device: &SwanDevice, u: f64) -> Result<SwanSizing, ModelError> {
    if !(u.is_finite() && u > 0.0 && u < 1.0) {
        return Err(ModelError::InvalidUtilisation(u));
    }
    check_positive("erase_us", device.erase_us)?;
    check_positive("read_us", device.read_us)?;
    check_positive("write_us", device.write_us)?;
    if device.blocks_per_segment == 0 {
        return Err(ModelError::InvalidPagesPerBlock(0));
    }
    let b = device.blocks_per_segment as f64;
    let (te, tr, tw) = (device.erase_us, device.read_us * b, device.write_us * b);
    let min_groups = te / tw / (1.0 - u) + (tr / tw + 1.0) * u / (1.0 - u) + 1.0;
    Ok(SwanSizing {
        segment_utilization: u,
        clean_segment_us: te + u * (tr + tw),
        consume_segment_us: (1.0 - u) * tw,
        min_groups,
    })
}

/// Equation 1 for disk utilisation `u_d`, through `u_d = (u − 1) / ln u`.
pub fn min_groups_for_disk_utilization(
    device: &SwanDevice,
    u_d: f64,
) -> Result<SwanSizing, ModelError> {
    let u = segment_utilisation_from_disk_utilisation(u_d)?;
    min_groups(device, u)
}

/// The R-group width that fills the network, and how a box of SSDs splits into R-groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupWidth {
    /// SSDs per R-group whose summed write bandwidth reaches the network's (the paper counts
    /// every member's bandwidth, parity included: XtremIO's 10 GB/s over 2.5 GB/s SSDs gives
    /// four, "three for data and one for parity").
    pub ssds_per_group: u32,
    /// Of which data members.
    pub data_per_group: u32,
    /// R-groups that fit in `ssds` (when given), and the SSDs left over.
    pub groups: Option<u32>,
    pub leftover_ssds: Option<u32>,
}

/// Width of an R-group for `network_gb_s` over SSDs of `ssd_write_gb_s`, with `parity`
/// parity members, and how many such groups `ssds` SSDs make.
pub fn group_width(
    network_gb_s: f64,
    ssd_write_gb_s: f64,
    parity: u32,
    ssds: Option<u32>,
) -> Result<GroupWidth, ModelError> {
    check_positive("network_gb_s", network_gb_s)?;
    check_positive("ssd_write_gb_s", ssd_write_gb_s)?;
    let width = ((network_gb_s / ssd_write_gb_s) - 1e-9).ceil().max(1.0) as u32;
    let width = width.max(parity + 1);
    Ok(GroupWidth {
        ssds_per_group: width,
        data_per_group: width - parity,
        groups: ssds.map(|n| n / width),
        leftover_ssds: ssds.map(|n| n % width),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAPER: SwanDevice = SwanDevice {
        erase_us: 4000.0,
        read_us: 15.6,
        write_us: 19.5,
        blocks_per_segment: 256,
    };

    #[test]
    fn reproduces_the_papers_example() {
        let s = min_groups_for_disk_utilization(&PAPER, 0.6).unwrap();
        assert!((s.segment_utilization - 0.33).abs() < 0.01, "{s:?}");
        // Equation 1 with the stated 4 ms erase gives about 3.05; the paper's 1.89 is what
        // it gives with the erase entered as 4 µs (docs/swan.md).
        assert!((s.min_groups - 3.05).abs() < 0.01, "{s:?}");
        let slip = SwanDevice {
            erase_us: 4.0,
            ..PAPER
        };
        let s = min_groups_for_disk_utilization(&slip, 0.6).unwrap();
        assert!((s.min_groups - 1.89).abs() < 0.03, "{s:?}");
        let rounded = min_groups(&slip, 0.33).unwrap();
        assert!((rounded.min_groups - 1.89).abs() < 0.005, "{rounded:?}");
    }

    #[test]
    fn more_utilisation_needs_more_groups() {
        let a = min_groups(&PAPER, 0.2).unwrap().min_groups;
        let b = min_groups(&PAPER, 0.5).unwrap().min_groups;
        assert!(b > a);
        // Equation 1 rearranged: the clean time equals the recycle time at N.
        let s = min_groups(&PAPER, 0.5).unwrap();
        let recycle = (s.min_groups - 1.0) * s.consume_segment_us;
        assert!((recycle - s.clean_segment_us).abs() < 1e-6);
    }

    #[test]
    fn xtremio_sizing() {
        let w = group_width(10.0, 2.5, 1, Some(18)).unwrap();
        assert_eq!((w.ssds_per_group, w.data_per_group), (4, 3));
        assert_eq!((w.groups, w.leftover_ssds), (Some(4), Some(2)));
    }

    #[test]
    fn bad_input_names_the_parameter() {
        let e = min_groups(
            &SwanDevice {
                erase_us: -1.0,
                ..PAPER
            },
            0.3,
        )
        .unwrap_err();
        assert!(e.to_string().contains("erase_us"), "{e}");
        assert!(min_groups(&PAPER, 1.0).is_err());
        assert!(group_width(0.0, 1.0, 0, None).is_err());
    }
}
