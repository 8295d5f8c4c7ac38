//! The crate's error type.
//!
//! `Display` and `Error` are implemented by hand rather than with `thiserror`, because
//! several variants carry a field named `source` (the name of the trace being read), and
//! `thiserror` would insist that such a field is the underlying error cause.

use std::fmt;

/// Everything that can go wrong while parsing a workload description or a trace, or while
/// building a generator from a job.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkloadError {
    /// A job-file option that this simulator does not know: a typo, or a fio option it
    /// neither models nor names as one to ignore or to refuse.
    UnknownOption {
        /// The section the option appeared in, without brackets.
        section: String,
        /// The option name as written.
        option: String,
        /// 1-based line number in the job file.
        line: usize,
    },
    /// A fio option this simulator knows but does not model, with what to do instead.
    UnsupportedOption {
        /// The section the option appeared in, without brackets.
        section: String,
        /// The option name as written.
        option: String,
        /// 1-based line number in the job file.
        line: usize,
        /// Why it is not modelled, and what to use instead.
        reason: String,
    },
    /// A known job-file option with a value that cannot be used.
    BadValue {
        /// The section the option appeared in, without brackets.
        section: String,
        /// The option name as written.
        option: String,
        /// The value as written.
        value: String,
        /// Why the value was refused.
        reason: String,
        /// 1-based line number in the job file.
        line: usize,
    },
    /// A job-file line that is neither a section header, an option, a comment nor blank,
    /// or an option that appears before any section.
    Syntax {
        /// 1-based line number in the job file.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// The job file defines no job section (only `[global]` or nothing at all).
    NoJobs,
    /// A job whose options are individually valid but cannot be run against the given
    /// device (empty region, block size not a multiple of the sector size, ...).
    InvalidJob {
        /// The job's name.
        job: String,
        /// Why the job cannot be run.
        reason: String,
    },
    /// A malformed line in a block trace.
    TraceLine {
        /// The name of the trace (usually its path), as given by the caller.
        source: String,
        /// 1-based line number in the trace.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// An I/O error while reading a trace.
    Io {
        /// The name of the trace (usually its path), as given by the caller.
        source: String,
        /// The underlying error.
        error: std::io::Error,
    },
    /// A trace format name that is not one of the supported formats.
    UnknownTraceFormat {
        /// The name as given.
        name: String,
    },
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadError::UnknownOption {
                section,
                option,
                line,
            } => write!(
                f,
                "job file line {line}, section [{section}]: unknown option '{option}'"
            ),
            WorkloadError::UnsupportedOption {
                section,
                option,
                line,
                reason,
            } => write!(
                f,
                "job file line {line}, section [{section}]: fio option '{option}' is not \
                 modelled: {reason}"
            ),
            WorkloadError::BadValue {
                section,
                option,
                value,
                reason,
                line,
            } => write!(
                f,
                "job file line {line}, section [{section}]: bad value '{value}' for option \
                 '{option}': {reason}"
            ),
            WorkloadError::Syntax { line, reason } => {
                write!(f, "job file line {line}: {reason}")
            }
            WorkloadError::NoJobs => write!(f, "job file defines no job section"),
            WorkloadError::InvalidJob { job, reason } => write!(f, "job [{job}]: {reason}"),
            WorkloadError::TraceLine {
                source,
                line,
                reason,
            } => write!(f, "trace {source} line {line}: {reason}"),
            WorkloadError::Io { source, error } => write!(f, "reading trace {source}: {error}"),
            WorkloadError::UnknownTraceFormat { name } => write!(
                f,
                "unknown trace format '{name}' (expected msr, blkparse, fiu, iolog, ascii, spc, alibaba \
                 or tencent)"
            ),
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkloadError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_option_display_names_line_section_and_option() {
        let error = WorkloadError::UnknownOption {
            section: "randw".into(),
            option: "iodeph".into(),
            line: 7,
        };
        assert_eq!(
            error.to_string(),
            "job file line 7, section [randw]: unknown option 'iodeph'"
        );
    }

    #[test]
    fn bad_value_display_names_everything() {
        let error = WorkloadError::BadValue {
            section: "global".into(),
            option: "iodepth".into(),
            value: "0".into(),
            reason: "must be at least 1".into(),
            line: 3,
        };
        assert_eq!(
            error.to_string(),
            "job file line 3, section [global]: bad value '0' for option 'iodepth': must be at \
             least 1"
        );
    }

    #[test]
    fn trace_line_display_names_source_and_line() {
        let error = WorkloadError::TraceLine {
            source: "t.csv".into(),
            line: 12,
            reason: "bad offset".into(),
        };
        assert_eq!(error.to_string(), "trace t.csv line 12: bad offset");
    }

    #[test]
    fn io_error_is_exposed_as_source() {
        use std::error::Error as _;
        let error = WorkloadError::Io {
            source: "t.csv".into(),
            error: std::io::Error::other("disk on fire"),
        };
        assert!(error.source().is_some());
        assert!(error.to_string().contains("disk on fire"));
    }
}
