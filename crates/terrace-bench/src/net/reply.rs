//! Replies of memcached's text and meta protocols, read from a byte stream: lines ending
//! in `\r\n` and data blocks of a stated length. Only the replies the `net-*` commands
//! ask for are understood (`MN`, `HD`, `NS`, `VA`, `EN`, `STAT`/`END` and the error
//! lines).
//!
//! Invariants: a line is at most [`MAX_LINE`] bytes and a data block at most
//! [`MAX_DATA`]; anything malformed, unexpected or over a limit is a [`ReplyError`],
//! never a panic, and a closed stream is [`ReplyError::Closed`], never a hang (callers
//! set the socket's read timeout).

use std::fmt;
use std::io::{self, BufRead, BufReader, Read};

/// Longest reply line accepted, `\r\n` included.
pub const MAX_LINE: u64 = 4096;
/// Largest data block accepted (memcached's largest item is 1 GiB; these tools read
/// their own values, far smaller).
pub const MAX_DATA: usize = 64 << 20;

#[derive(Debug)]
pub enum ReplyError {
    Io(io::Error),
    /// The server closed the connection where a reply was due.
    Closed,
    /// A line longer than [`MAX_LINE`], or without its `\r\n`.
    BadLine(String),
    /// A reply this client did not ask for, or one it cannot parse.
    Unexpected {
        wanted: &'static str,
        got: String,
    },
    /// A data block over [`MAX_DATA`] or not followed by `\r\n`.
    BadData(String),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Io(e) if is_timeout(e) => write!(f, "no reply in time: {e}"),
            ReplyError::Io(e) => write!(f, "reading a reply: {e}"),
            ReplyError::Closed => write!(f, "the server closed the connection"),
            ReplyError::BadLine(s) => write!(f, "malformed reply line: {s}"),
            ReplyError::Unexpected { wanted, got } => {
                write!(f, "expected {wanted}, the server replied {got:?}")
            }
            ReplyError::BadData(s) => write!(f, "malformed data block: {s}"),
        }
    }
}

impl std::error::Error for ReplyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplyError::Io(e) => Some(e),
            _ => None,
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl From<io::Error> for ReplyError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReplyError::Closed
        } else {
            ReplyError::Io(e)
        }
    }
}

/// A line for an error message: lossy UTF-8, at most 200 characters.
fn shown(line: &[u8]) -> String {
    String::from_utf8_lossy(line).chars().take(200).collect()
}

/// Whether a reply line is one of memcached's error lines (for one request).
fn is_error_line(line: &[u8]) -> bool {
    line == b"ERROR"
        || line.starts_with(b"CLIENT_ERROR")
        || line.starts_with(b"SERVER_ERROR")
        || line == b"NS"
        || line == b"EX"
        || line == b"NF"
}

/// What a meta get (`mg <key> v`) answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Got {
    /// `VA`: the value is in the caller's buffer.
    Hit,
    /// `EN`.
    Miss,
}

/// What came back for one part of a pipeline of quiet meta sets and flagless meta gets
/// (`mg <key>`), ended by `mn`.
#[derive(Debug, PartialEq, Eq)]
pub enum SyncReply {
    /// `MN`: every request before it was answered.
    Synced,
    /// `HD`: a flagless meta get found its item.
    Found,
    /// `EN`: a flagless meta get did not.
    NotFound,
    /// An error line for one request (`NS`, `SERVER_ERROR ...`): that set failed.
    Failed(String),
}

/// What a plain (not quiet) meta set (`ms <key> <len>`) answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Stored {
    /// `HD`.
    Stored,
    /// `NS` or an error line for this request (`SERVER_ERROR out of memory ...`): the
    /// line.
    Refused(String),
}

/// Reads replies from a stream.
pub struct Replies<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
}

impl<R: Read> Replies<R> {
    pub fn new(stream: R) -> Self {
        Replies {
            inner: BufReader::with_capacity(256 << 10, stream),
            line: Vec::with_capacity(128),
        }
    }

    /// The next line, without its `\r\n`.
    fn next_line(&mut self) -> Result<&[u8], ReplyError> {
        self.line.clear();
        let n = (&mut self.inner)
            .take(MAX_LINE)
            .read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Err(ReplyError::Closed);
        }
        if !self.line.ends_with(b"\r\n") {
            return Err(ReplyError::BadLine(shown(&self.line)));
        }
        Ok(&self.line[..self.line.len() - 2])
    }

    /// The answer to a quiet meta set, a flagless meta get or `mn`, in a pipeline of
    /// them.
    pub fn sync(&mut self) -> Result<SyncReply, ReplyError> {
        let line = self.next_line()?;
        if line == b"MN" {
            Ok(SyncReply::Synced)
        } else if line == b"HD" {
            Ok(SyncReply::Found)
        } else if line == b"EN" {
            Ok(SyncReply::NotFound)
        } else if is_error_line(line) {
            Ok(SyncReply::Failed(shown(line)))
        } else {
            Err(ReplyError::Unexpected {
                wanted: "MN, HD, EN or an error line",
                got: shown(line),
            })
        }
    }

    /// The answer to a plain meta set (`ms <key> <len>` and its data).
    pub fn meta_set(&mut self) -> Result<Stored, ReplyError> {
        let line = self.next_line()?;
        if line == b"HD" {
            Ok(Stored::Stored)
        } else if is_error_line(line) {
            Ok(Stored::Refused(shown(line)))
        } else {
            Err(ReplyError::Unexpected {
                wanted: "HD, NS or an error line",
                got: shown(line),
            })
        }
    }

    /// The answer to `mg <key> v`: on a hit, the value replaces `value`'s contents.
    pub fn meta_get(&mut self, value: &mut Vec<u8>) -> Result<Got, ReplyError> {
        let line = self.next_line()?;
        if line == b"EN" {
            return Ok(Got::Miss);
        }
        let len = match line.strip_prefix(b"VA ") {
            Some(rest) => {
                let digits = rest.split(|&b| b == b' ').next().unwrap_or_default();
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|s| s.parse::<usize>().ok())
                    .ok_or_else(|| ReplyError::BadLine(shown(line)))?
            }
            None => {
                return Err(ReplyError::Unexpected {
                    wanted: "VA or EN",
                    got: shown(line),
                })
            }
        };
        if len > MAX_DATA {
            return Err(ReplyError::BadData(format!(
                "{len} bytes, more than {MAX_DATA}"
            )));
        }
        value.resize(len + 2, 0);
        self.inner.read_exact(value)?;
        if !value.ends_with(b"\r\n") {
            return Err(ReplyError::BadData(format!(
                "{len} bytes not followed by \\r\\n"
            )));
        }
        value.truncate(len);
        Ok(Got::Hit)
    }

    /// The answer to `stats`: its `STAT name value` lines up to `END`, in order.
    pub fn stats(&mut self) -> Result<Vec<(String, String)>, ReplyError> {
        let mut out = Vec::new();
        loop {
            let line = self.next_line()?;
            if line == b"END" {
                return Ok(out);
            }
            let text = std::str::from_utf8(line).map_err(|_| ReplyError::BadLine(shown(line)))?;
            let mut parts = text.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("STAT"), Some(name), value) => {
                    out.push((name.to_string(), value.unwrap_or("").to_string()));
                }
                _ => {
                    return Err(ReplyError::Unexpected {
                        wanted: "STAT or END",
                        got: shown(line),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(s: &[u8]) -> Replies<&[u8]> {
        Replies::new(s)
    }

    #[test]
    fn meta_gets() {
        let mut r = replies(b"VA 5 f0\r\nhello\r\nEN\r\nVA 0\r\n\r\n");
        let mut v = Vec::new();
        assert_eq!(r.meta_get(&mut v).unwrap(), Got::Hit);
        assert_eq!(v, b"hello");
        assert_eq!(r.meta_get(&mut v).unwrap(), Got::Miss);
        assert_eq!(r.meta_get(&mut v).unwrap(), Got::Hit);
        assert_eq!(v, b"");
        assert!(matches!(r.meta_get(&mut v), Err(ReplyError::Closed)));
    }

    #[test]
    fn bad_meta_gets_are_errors() {
        let mut v = Vec::new();
        for bad in [
            &b"VA x\r\nhello\r\n"[..],
            b"VA 5\r\nhelloXX",
            b"VA 5\r\nhel",
            b"HD\r\n",
            b"SERVER_ERROR out of memory\r\n",
            b"EN\n",
            b"VA 99999999999999999999\r\n",
        ] {
            assert!(
                replies(bad).meta_get(&mut v).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'a'; MAX_LINE as usize + 10];
        assert!(matches!(
            replies(&long).meta_get(&mut v),
            Err(ReplyError::BadLine(_))
        ));
    }

    #[test]
    fn syncs_and_failures() {
        let mut r = replies(
            b"MN\r\nSERVER_ERROR out of memory storing object\r\nMN\r\nHD\r\nEN\r\nVA 1\r\n",
        );
        assert_eq!(r.sync().unwrap(), SyncReply::Synced);
        assert!(matches!(r.sync().unwrap(), SyncReply::Failed(s) if s.contains("out of memory")));
        assert_eq!(r.sync().unwrap(), SyncReply::Synced);
        assert_eq!(r.sync().unwrap(), SyncReply::Found);
        assert_eq!(r.sync().unwrap(), SyncReply::NotFound);
        assert!(matches!(r.sync(), Err(ReplyError::Unexpected { .. })));
    }

    #[test]
    fn meta_sets() {
        let mut r = replies(b"HD\r\nNS\r\nSERVER_ERROR out of memory storing object\r\nEN\r\n");
        assert_eq!(r.meta_set().unwrap(), Stored::Stored);
        assert_eq!(r.meta_set().unwrap(), Stored::Refused("NS".to_string()));
        assert!(matches!(r.meta_set().unwrap(), Stored::Refused(s) if s.contains("out of memory")));
        assert!(matches!(r.meta_set(), Err(ReplyError::Unexpected { .. })));
        assert!(matches!(r.meta_set(), Err(ReplyError::Closed)));
    }

    #[test]
    fn stats() {
        let mut r = replies(b"STAT pid 1\r\nSTAT curr_items 42\r\nSTAT version 1.6 x\r\nEND\r\n");
        let s = r.stats().unwrap();
        assert_eq!(s[1], ("curr_items".to_string(), "42".to_string()));
        assert_eq!(s[2].1, "1.6 x");
        assert!(replies(b"STAT a 1\r\nVALUE x\r\n").stats().is_err());
        assert!(matches!(
            replies(b"STAT a 1\r\n").stats(),
            Err(ReplyError::Closed)
        ));
    }
}
