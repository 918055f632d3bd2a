//! The replication protocol's messages, as bytes on a TCP stream (all integers
//! little-endian). A primary connects to each secondary and sends a [`Hello`]; the
//! secondary answers with a [`Welcome`]; then the primary sends frames ([`FrameHeader`]) and the
//! secondary answers some of them with [`Ack`]s, in order.
//!
//! - Hello: `"TVRP" | version u32 | epoch u64 | stream u64 | store size u64 | name
//!   length u16 | name`.
//! - Welcome: `"TVRP" | verdict u8 | epoch u64 | stream u64 | consistent u8 | message
//!   length u16 | message`. The verdict is 0 (go on), 1 (fenced: the secondary has seen
//!   a newer epoch, which the reply carries) or 2 (refused; the message says why).
//! - Frame: `kind u8 | epoch u64 | seq u64 | offset u64 | length u32`, then `length`
//!   data bytes for a WRITE or a DIGEST. `seq` numbers the frames of one connection
//!   from 1; DIGEST frames, sent before a resync begins, have seq 0.
//! - DIGEST data ([`DigestRequest`]): `unit u32 | ranges u32`, then per range `first
//!   unit u64 | units u64`: asks a hash of each unit of the copy in those ranges.
//! - Ack: `kind u8 | seq u64 | epoch-or-count u64`: SYNCED (every frame through `seq`
//!   is applied and durable there), FENCED (a newer epoch, carried, took the volume) or
//!   DIGEST (a DIGEST frame's answer: `count` hashes of 8 bytes follow, one per unit
//!   asked, in order).
//!
//! Nothing here trusts the peer: lengths are bounded, magic and version checked, and a
//! bad message is an `InvalidData` error that ends the connection. Both ends set their
//! connection up with [`watch_for_vanished_peer`], so a peer that silently went away
//! ends it too.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MAGIC: &[u8; 4] = b"TVRP";
const VERSION: u32 = 2;
/// The most data one WRITE frame carries (the primary splits nothing: the write log
/// writes records of at most a few MiB, and superblock slots).
pub const MAX_WRITE: u32 = 64 << 20;
const MAX_NAME: usize = 255;

/// Makes a replication connection notice a peer that vanished without closing it (its
/// node lost, the network cut, no FIN or RST ever comes): TCP keepalive probes after
/// `silence` without traffic, one a second, three unanswered ending the connection; and
/// data the peer's TCP leaves unacknowledged for `silence` + 3 s ending it too
/// (`TCP_USER_TIMEOUT`). A thread blocked reading or writing then gets an error instead
/// of waiting for ever — on an idle volume nothing else would tell.
pub fn watch_for_vanished_peer(socket: &TcpStream, silence: Duration) -> io::Result<()> {
    use rustix::net::sockopt;
    let idle = silence.max(Duration::from_secs(1));
    sockopt::set_socket_keepalive(socket, true)?;
    sockopt::set_tcp_keepidle(socket, idle)?;
    sockopt::set_tcp_keepintvl(socket, Duration::from_secs(1))?;
    sockopt::set_tcp_keepcnt(socket, 3)?;
    let unacknowledged = (idle + Duration::from_secs(3)).as_millis();
    sockopt::set_tcp_user_timeout(socket, u32::try_from(unacknowledged).unwrap_or(u32::MAX))?;
    Ok(())
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// What the primary says first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub epoch: u64,
    /// The primary's stream: one per primary process, so a secondary that was in sync
    /// with it can be caught up from the primary's bitmap instead of compared whole.
    pub stream: u64,
    pub store_size: u64,
    pub volume: String,
}

impl Hello {
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut b = Vec::with_capacity(34 + self.volume.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.extend_from_slice(&self.store_size.to_le_bytes());
        b.extend_from_slice(&(self.volume.len() as u16).to_le_bytes());
        b.extend_from_slice(self.volume.as_bytes());
        w.write_all(&b)
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Hello> {
        let mut b = [0u8; 34];
        r.read_exact(&mut b)?;
        if &b[0..4] != MAGIC {
            return Err(bad("not a Terrace replication hello"));
        }
        let version = u32::from_le_bytes(b[4..8].try_into().unwrap());
        if version != VERSION {
            return Err(bad(format!(
                "replication protocol version {version}, expected {VERSION}"
            )));
        }
        let name_len = u16::from_le_bytes(b[32..34].try_into().unwrap()) as usize;
        if name_len == 0 || name_len > MAX_NAME {
            return Err(bad(format!("a volume name of {name_len} bytes")));
        }
        let mut name = vec![0u8; name_len];
        r.read_exact(&mut name)?;
        let volume = String::from_utf8(name).map_err(|_| bad("a volume name that is not UTF-8"))?;
        if !valid_volume_name(&volume) {
            return Err(bad(format!(
                "volume name {volume:?} is not a plain file name"
            )));
        }
        Ok(Hello {
            epoch: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            stream: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            store_size: u64::from_le_bytes(b[24..32].try_into().unwrap()),
            volume,
        })
    }
}

/// A name the secondary may use in a file name: no path separators, no dot files.
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The secondary's answer to a [`Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Proceed = 0,
    Fenced = 1,
    Refused = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub verdict: Verdict,
    /// The highest epoch the secondary has seen for the volume.
    pub epoch: u64,
    /// The primary stream its copy was last in sync with (0: none).
    pub stream: u64,
    /// Whether its copy is whole (false during and after an unfinished resync).
    pub consistent: bool,
    pub message: String,
}

impl Welcome {
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let msg = &self.message.as_bytes()[..self.message.len().min(1024)];
        let mut b = Vec::with_capacity(24 + msg.len());
        b.extend_from_slice(MAGIC);
        b.push(self.verdict as u8);
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.push(self.consistent as u8);
        b.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        b.extend_from_slice(msg);
        w.write_all(&b)
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Welcome> {
        let mut b = [0u8; 24];
        r.read_exact(&mut b)?;
        if &b[0..4] != MAGIC {
            return Err(bad("not a Terrace replication welcome"));
        }
        let verdict = match b[4] {
            0 => Verdict::Proceed,
            1 => Verdict::Fenced,
            2 => Verdict::Refused,
            v => return Err(bad(format!("unknown verdict {v}"))),
        };
        let len = u16::from_le_bytes(b[22..24].try_into().unwrap()) as usize;
        if len > 1024 {
            return Err(bad("a welcome message over 1 KiB"));
        }
        let mut msg = vec![0u8; len];
        r.read_exact(&mut msg)?;
        Ok(Welcome {
            verdict,
            epoch: u64::from_le_bytes(b[5..13].try_into().unwrap()),
            stream: u64::from_le_bytes(b[13..21].try_into().unwrap()),
            consistent: b[21] != 0,
            message: String::from_utf8_lossy(&msg).into_owned(),
        })
    }
}

/// What a frame asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Write the data at the offset.
    Write = 1,
    /// Make every frame so far durable, then ack this seq.
    Sync = 2,
    /// A resync starts: the copy is not whole until its end (recorded durably first).
    ResyncBegin = 3,
    /// The resync is done: make everything durable, record the copy whole, ack.
    ResyncEnd = 4,
    /// Hash units of the copy (the data is a [`DigestRequest`]) and answer with an
    /// [`Ack::Digest`]; changes nothing.
    Digest = 5,
}

pub const FRAME_HEADER: usize = 29;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub epoch: u64,
    pub seq: u64,
    pub offset: u64,
    pub len: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER] {
        let mut b = [0u8; FRAME_HEADER];
        b[0] = self.kind as u8;
        b[1..9].copy_from_slice(&self.epoch.to_le_bytes());
        b[9..17].copy_from_slice(&self.seq.to_le_bytes());
        b[17..25].copy_from_slice(&self.offset.to_le_bytes());
        b[25..29].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; FRAME_HEADER]) -> io::Result<FrameHeader> {
        let kind = match b[0] {
            1 => FrameKind::Write,
            2 => FrameKind::Sync,
            3 => FrameKind::ResyncBegin,
            4 => FrameKind::ResyncEnd,
            5 => FrameKind::Digest,
            k => return Err(bad(format!("unknown frame kind {k}"))),
        };
        let len = u32::from_le_bytes(b[25..29].try_into().unwrap());
        if !matches!(kind, FrameKind::Write | FrameKind::Digest) && len != 0 {
            return Err(bad(format!("a {kind:?} frame with {len} data bytes")));
        }
        if len > MAX_WRITE {
            return Err(bad(format!("a write frame of {len} bytes")));
        }
        Ok(FrameHeader {
            kind,
            epoch: u64::from_le_bytes(b[1..9].try_into().unwrap()),
            seq: u64::from_le_bytes(b[9..17].try_into().unwrap()),
            offset: u64::from_le_bytes(b[17..25].try_into().unwrap()),
            len,
        })
    }
}

/// The most units one DIGEST asks (8 bytes of answer each: 128 MiB at most).
pub const MAX_DIGEST_UNITS: u64 = 16 << 20;

/// What a DIGEST frame asks: a hash of each `unit`-byte unit of the copy in `ranges`
/// (first unit, units), the last unit of the store cut at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestRequest {
    pub unit: u32,
    pub ranges: Vec<(u64, u64)>,
}

impl DigestRequest {
    pub fn units(&self) -> u64 {
        self.ranges.iter().map(|&(_, n)| n).sum()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + 16 * self.ranges.len());
        b.extend_from_slice(&self.unit.to_le_bytes());
        b.extend_from_slice(&(self.ranges.len() as u32).to_le_bytes());
        for &(first, n) in &self.ranges {
            b.extend_from_slice(&first.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        b
    }

    /// Decodes a request for a store of `store_size` bytes: every range inside it, a
    /// unit of 4 KiB to 64 MiB, at most [`MAX_DIGEST_UNITS`] in all.
    pub fn decode(b: &[u8], store_size: u64) -> io::Result<DigestRequest> {
        if b.len() < 8 {
            return Err(bad("a digest request under 8 bytes"));
        }
        let unit = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let count = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
        if !(4096..=64 << 20).contains(&unit) {
            return Err(bad(format!("a digest unit of {unit} bytes")));
        }
        if b.len() != 8 + 16 * count {
            return Err(bad(format!(
                "a digest request of {} bytes for {count} ranges",
                b.len()
            )));
        }
        let units_in_store = store_size.div_ceil(unit as u64);
        let mut ranges = Vec::with_capacity(count);
        let mut total = 0u64;
        for r in b[8..].chunks_exact(16) {
            let first = u64::from_le_bytes(r[0..8].try_into().unwrap());
            let n = u64::from_le_bytes(r[8..16].try_into().unwrap());
            if first.checked_add(n).is_none_or(|end| end > units_in_store) {
                return Err(bad(format!(
                    "digest units {first}+{n} past the store's {units_in_store}"
                )));
            }
            total += n;
            ranges.push((first, n));
        }
        if total > MAX_DIGEST_UNITS {
            return Err(bad(format!("a digest of {total} units")));
        }
        Ok(DigestRequest { unit, ranges })
    }
}

/// The secondary's answer to a SYNC, RESYNC_END or DIGEST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    Synced {
        seq: u64,
    },
    Fenced {
        epoch: u64,
    },
    /// `count` hashes follow ([`read_hashes`]).
    Digest {
        count: u64,
    },
}

/// Writes a DIGEST answer: the ack, then the hashes.
pub fn write_digest(w: &mut impl Write, hashes: &[u64]) -> io::Result<()> {
    let mut b = Vec::with_capacity(ACK_BYTES + 8 * hashes.len());
    b.extend_from_slice(
        &Ack::Digest {
            count: hashes.len() as u64,
        }
        .encode(),
    );
    for h in hashes {
        b.extend_from_slice(&h.to_le_bytes());
    }
    w.write_all(&b)
}

/// Reads the `count` hashes that follow an [`Ack::Digest`] (at most
/// [`MAX_DIGEST_UNITS`]).
pub fn read_hashes(r: &mut impl Read, count: u64) -> io::Result<Vec<u64>> {
    if count > MAX_DIGEST_UNITS {
        return Err(bad(format!("a digest of {count} hashes")));
    }
    let mut b = vec![0u8; count as usize * 8];
    r.read_exact(&mut b)?;
    Ok(b.chunks_exact(8)
        .map(|h| u64::from_le_bytes(h.try_into().unwrap()))
        .collect())
}

pub const ACK_BYTES: usize = 17;

impl Ack {
    pub fn encode(&self) -> [u8; ACK_BYTES] {
        let mut b = [0u8; ACK_BYTES];
        match *self {
            Ack::Synced { seq } => {
                b[0] = 1;
                b[1..9].copy_from_slice(&seq.to_le_bytes());
            }
            Ack::Fenced { epoch } => {
                b[0] = 2;
                b[9..17].copy_from_slice(&epoch.to_le_bytes());
            }
            Ack::Digest { count } => {
                b[0] = 3;
                b[9..17].copy_from_slice(&count.to_le_bytes());
            }
        }
        b
    }

    pub fn read_from(r: &mut impl Read) -> io::Result<Ack> {
        let mut b = [0u8; ACK_BYTES];
        r.read_exact(&mut b)?;
        match b[0] {
            1 => Ok(Ack::Synced {
                seq: u64::from_le_bytes(b[1..9].try_into().unwrap()),
            }),
            2 => Ok(Ack::Fenced {
                epoch: u64::from_le_bytes(b[9..17].try_into().unwrap()),
            }),
            3 => Ok(Ack::Digest {
                count: u64::from_le_bytes(b[9..17].try_into().unwrap()),
            }),
            k => Err(bad(format!("unknown ack kind {k}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_bytes_are_errors() {
        let hello = Hello {
            epoch: 7,
            stream: 99,
            store_size: 1 << 20,
            volume: "vol-1".into(),
        };
        let mut b = Vec::new();
        hello.write_to(&mut b).unwrap();
        assert_eq!(Hello::read_from(&mut &b[..]).unwrap(), hello);
        let mut evil = b.clone();
        evil[0] = b'X';
        assert!(Hello::read_from(&mut &evil[..]).is_err());
        let sneaky = Hello {
            volume: "../etc".into(),
            ..hello.clone()
        };
        let mut b = Vec::new();
        sneaky.write_to(&mut b).unwrap();
        assert!(Hello::read_from(&mut &b[..]).is_err());

        let welcome = Welcome {
            verdict: Verdict::Fenced,
            epoch: 9,
            stream: 3,
            consistent: true,
            message: "newer".into(),
        };
        let mut b = Vec::new();
        welcome.write_to(&mut b).unwrap();
        assert_eq!(Welcome::read_from(&mut &b[..]).unwrap(), welcome);

        let h = FrameHeader {
            kind: FrameKind::Write,
            epoch: 1,
            seq: 2,
            offset: 3,
            len: 4,
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
        let mut huge = h.encode();
        huge[25..29].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(FrameHeader::decode(&huge).is_err());
        let mut sync_with_data = h.encode();
        sync_with_data[0] = FrameKind::Sync as u8;
        assert!(FrameHeader::decode(&sync_with_data).is_err());

        for ack in [
            Ack::Synced { seq: 5 },
            Ack::Fenced { epoch: 6 },
            Ack::Digest { count: 7 },
        ] {
            assert_eq!(Ack::read_from(&mut &ack.encode()[..]).unwrap(), ack);
        }
        let mut b = Vec::new();
        write_digest(&mut b, &[1, u64::MAX]).unwrap();
        let mut r = &b[..];
        assert_eq!(Ack::read_from(&mut r).unwrap(), Ack::Digest { count: 2 });
        assert_eq!(read_hashes(&mut r, 2).unwrap(), vec![1, u64::MAX]);
        assert!(read_hashes(&mut &[0u8; 8][..], 2).is_err());
        assert!(read_hashes(&mut &[][..], MAX_DIGEST_UNITS + 1).is_err());

        let req = DigestRequest {
            unit: 4096,
            ranges: vec![(0, 3), (10, 6)],
        };
        assert_eq!(
            DigestRequest::decode(&req.encode(), 16 * 4096).unwrap(),
            req
        );
        // Past the store, a unit out of bounds, a length that lies: errors.
        assert!(DigestRequest::decode(&req.encode(), 15 * 4096).is_err());
        let odd = DigestRequest {
            unit: 512,
            ..req.clone()
        };
        assert!(DigestRequest::decode(&odd.encode(), 1 << 20).is_err());
        let mut short = req.encode();
        short.pop();
        assert!(DigestRequest::decode(&short, 1 << 20).is_err());
        let wrapping = DigestRequest {
            unit: 4096,
            ranges: vec![(u64::MAX, 2)],
        };
        assert!(DigestRequest::decode(&wrapping.encode(), 1 << 20).is_err());
        assert!(Ack::read_from(&mut &[9u8; ACK_BYTES][..]).is_err());
        // A truncated message is an error, not a hang or a panic.
        assert!(Ack::read_from(&mut &[1u8; 3][..]).is_err());
    }
}
