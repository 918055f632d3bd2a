//! The NBD wire format (`doc/proto.md` of NetworkBlockDevice/nbd): constants and pure
//! encoders and parsers over byte slices. No I/O happens here; [`super::server`] and
//! [`super::client`] move the bytes.
//!
//! Invariants: every integer on the wire is big-endian; parsers never panic on any input
//! (a short or wrong slice is a [`ProtoError`]); encoders produce exactly the message the
//! spec describes, with no padding the spec does not ask for.

use std::fmt;

// ---- magics ----------------------------------------------------------------------------

/// `NBDMAGIC`, the first 8 bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle greeting's second magic, and the magic of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`: the first 4 bytes of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`: the first 4 bytes of every structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---- handshake flags (server, 16 bits) -------------------------------------------------

/// `NBD_FLAG_FIXED_NEWSTYLE`.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// `NBD_FLAG_NO_ZEROES`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// ---- client flags (32 bits) ------------------------------------------------------------

/// `NBD_FLAG_C_FIXED_NEWSTYLE`.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// `NBD_FLAG_C_NO_ZEROES`.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---- transmission flags (16 bits) ------------------------------------------------------

/// `NBD_FLAG_HAS_FLAGS`: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// `NBD_FLAG_READ_ONLY`.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// `NBD_FLAG_SEND_FLUSH`.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// `NBD_FLAG_SEND_FUA`.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// `NBD_FLAG_ROTATIONAL`.
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
/// `NBD_FLAG_SEND_TRIM`.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// `NBD_FLAG_SEND_WRITE_ZEROES`.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// `NBD_FLAG_SEND_DF`: set only when structured replies were negotiated.
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// `NBD_FLAG_CAN_MULTI_CONN`: a flush on one connection covers writes from all.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// `NBD_FLAG_SEND_CACHE`.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// `NBD_FLAG_SEND_FAST_ZERO`.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---- options ---------------------------------------------------------------------------

/// `NBD_OPT_EXPORT_NAME`: the old way to pick an export and enter transmission.
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`.
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`.
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`.
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// `NBD_OPT_LIST_META_CONTEXT`.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// `NBD_OPT_SET_META_CONTEXT`.
pub const OPT_SET_META_CONTEXT: u32 = 10;

// ---- option reply types ----------------------------------------------------------------

/// `NBD_REP_ACK`.
pub const REP_ACK: u32 = 1;
/// `NBD_REP_SERVER`: one export in the answer to `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// `NBD_REP_INFO`: one piece of information in the answer to `NBD_OPT_INFO`/`GO`.
pub const REP_INFO: u32 = 3;
/// Bit 31: the reply type is an error.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
/// `NBD_REP_ERR_UNSUP`: an option this server does not know.
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
/// `NBD_REP_ERR_POLICY`.
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
/// `NBD_REP_ERR_INVALID`: a known option with malformed data.
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
/// `NBD_REP_ERR_PLATFORM`.
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
/// `NBD_REP_ERR_TLS_REQD`.
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
/// `NBD_REP_ERR_UNKNOWN`: no export of that name.
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
/// `NBD_REP_ERR_SHUTDOWN`.
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
/// `NBD_REP_ERR_BLOCK_SIZE_REQD`.
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
/// `NBD_REP_ERR_TOO_BIG`: the option (or its reply) is larger than the server accepts.
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// ---- information types (NBD_REP_INFO) --------------------------------------------------

/// `NBD_INFO_EXPORT`: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`: the canonical export name.
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`: a human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`: minimum, preferred and maximum payload sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---- commands and command flags --------------------------------------------------------

/// `NBD_CMD_READ`.
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`.
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`: the client's soft disconnect; no reply.
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`.
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`.
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_CACHE`.
pub const CMD_CACHE: u16 = 5;
/// `NBD_CMD_WRITE_ZEROES`.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// `NBD_CMD_BLOCK_STATUS`.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// `NBD_CMD_FLAG_FUA`: the command's writes are durable before the reply.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// `NBD_CMD_FLAG_NO_HOLE` (write zeroes): allocate rather than punch.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// `NBD_CMD_FLAG_DF` (read): at most one content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// `NBD_CMD_FLAG_REQ_ONE` (block status).
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// `NBD_CMD_FLAG_FAST_ZERO` (write zeroes).
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ---- structured replies ----------------------------------------------------------------

/// `NBD_REPLY_FLAG_DONE`: the last chunk of a structured reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// `NBD_REPLY_TYPE_NONE`.
pub const REPLY_TYPE_NONE: u16 = 0;
/// `NBD_REPLY_TYPE_OFFSET_DATA`: 8 bytes of offset, then data.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// `NBD_REPLY_TYPE_OFFSET_HOLE`.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// `NBD_REPLY_TYPE_ERROR`: 4 bytes of error, 2 of message length, the message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
/// `NBD_REPLY_TYPE_ERROR_OFFSET`.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// ---- errors (Linux errno values) -------------------------------------------------------

/// `NBD_EPERM`.
pub const EPERM: u32 = 1;
/// `NBD_EIO`.
pub const EIO: u32 = 5;
/// `NBD_ENOMEM`.
pub const ENOMEM: u32 = 12;
/// `NBD_EINVAL`.
pub const EINVAL: u32 = 22;
/// `NBD_ENOSPC`.
pub const ENOSPC: u32 = 28;
/// `NBD_EOVERFLOW`.
pub const EOVERFLOW: u32 = 75;
/// `NBD_ENOTSUP`.
pub const ENOTSUP: u32 = 95;
/// `NBD_ESHUTDOWN`.
pub const ESHUTDOWN: u32 = 108;

// ---- sizes -----------------------------------------------------------------------------

/// The minimum block size we advertise (any byte alignment works).
pub const MIN_BLOCK_SIZE: u32 = 1;
/// The preferred block size we advertise.
pub const PREFERRED_BLOCK_SIZE: u32 = 4096;
/// The largest READ or WRITE payload either side sends: 32 MiB, the spec's default.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The longest string (export name, description) the spec allows.
pub const MAX_STRING: usize = 4096;

/// Bytes of the server's newstyle greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Bytes of an option header: `IHAVEOPT`, option, data length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Bytes of an option reply header: magic, option, reply type, data length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Bytes of a transmission request header.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Bytes of a simple reply (the data of a successful READ follows).
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Bytes before the data of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk (header and offset).
pub const OFFSET_DATA_PREFIX_LEN: usize = CHUNK_HEADER_LEN + 8;
/// The zeroes after `NBD_OPT_EXPORT_NAME`'s answer unless `NBD_FLAG_C_NO_ZEROES`.
pub const EXPORT_NAME_PADDING: usize = 124;

/// A message that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A magic number that is not the one the message must start with.
    #[error("bad {what} magic {found:#x}")]
    BadMagic { what: &'static str, found: u64 },
    /// Fewer bytes than the message needs.
    #[error("{what}: {len} bytes, need {need}")]
    Truncated {
        what: &'static str,
        len: usize,
        need: usize,
    },
    /// A well-framed message whose content is not allowed.
    #[error("{0}")]
    Invalid(String),
}

fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(word)
}

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

fn need(what: &'static str, bytes: &[u8], need: usize) -> Result<(), ProtoError> {
    if bytes.len() < need {
        return Err(ProtoError::Truncated {
            what,
            len: bytes.len(),
            need,
        });
    }
    Ok(())
}

// ---- handshake -------------------------------------------------------------------------

/// The server's newstyle greeting: `NBDMAGIC`, `IHAVEOPT`, `handshake_flags`.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut out = [0; GREETING_LEN];
    out[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Parses the server's greeting; returns its handshake flags. Oldstyle servers (whose
/// second magic differs) are refused.
pub fn parse_greeting(bytes: &[u8]) -> Result<u16, ProtoError> {
    need("greeting", bytes, GREETING_LEN)?;
    let magic = be_u64(bytes, 0);
    if magic != NBD_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "NBDMAGIC",
            found: magic,
        });
    }
    let second = be_u64(bytes, 8);
    if second != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            what: "IHAVEOPT (oldstyle server?)",
            found: second,
        });
    }
    Ok(be_u16(bytes, 16))
}

/// The header of one option the client sends during option haggling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// `NBD_OPT_*`.
    pub option: u32,
    /// Bytes of option data that follow the header.
    pub length: u32,
}

/// Parses an option header (`IHAVEOPT`, option, length).
pub fn parse_option_header(bytes: &[u8]) -> Result<OptionHeader, ProtoError> {
    need("option header", bytes, OPTION_HEADER_LEN)?;
    let magic = be_u64(bytes, 0);
    if magic != IHAVEOPT {
        return Err(ProtoError::BadMagic {
            what: "option",
            found: magic,
        });
    }
    Ok(OptionHeader {
        option: be_u32(bytes, 8),
        length: be_u32(bytes, 12),
    })
}

/// An option message: header and `data`.
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// An option reply: header and `data`.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_LEN + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The header of one option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option this answers.
    pub option: u32,
    /// `NBD_REP_*`.
    pub reply_type: u32,
    /// Bytes of reply data that follow.
    pub length: u32,
}

/// Parses an option reply header.
pub fn parse_option_reply_header(bytes: &[u8]) -> Result<OptionReplyHeader, ProtoError> {
    need("option reply header", bytes, OPTION_REPLY_HEADER_LEN)?;
    let magic = be_u64(bytes, 0);
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "option reply",
            found: magic,
        });
    }
    Ok(OptionReplyHeader {
        option: be_u32(bytes, 8),
        reply_type: be_u32(bytes, 12),
        length: be_u32(bytes, 16),
    })
}

/// The data of an `NBD_REP_SERVER` reply: the export's name.
pub fn encode_rep_server(name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// What an `NBD_OPT_INFO` or `NBD_OPT_GO` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// The export's name ("" for the default export).
    pub name: String,
    /// The `NBD_INFO_*` items the client asks for, in its order.
    pub info_types: Vec<u16>,
}

/// Parses the data of `NBD_OPT_INFO`/`NBD_OPT_GO`: name length, name, count, items.
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    need("NBD_OPT_GO data", data, 6)?;
    let name_len = be_u32(data, 0) as usize;
    if name_len > MAX_STRING || name_len > data.len() - 6 {
        return Err(ProtoError::Invalid(format!(
            "export name of {name_len} bytes in {} bytes of option data",
            data.len()
        )));
    }
    let name = std::str::from_utf8(&data[4..4 + name_len])
        .map_err(|_| ProtoError::Invalid("export name is not UTF-8".into()))?
        .to_owned();
    let count_at = 4 + name_len;
    let count = be_u16(data, count_at) as usize;
    let items = &data[count_at + 2..];
    if items.len() != count * 2 {
        return Err(ProtoError::Invalid(format!(
            "{count} information requests in {} bytes",
            items.len()
        )));
    }
    let info_types = items.chunks_exact(2).map(|item| be_u16(item, 0)).collect();
    Ok(InfoRequest { name, info_types })
}

/// The data of `NBD_OPT_INFO`/`NBD_OPT_GO` (the client's side of [`parse_info_request`]).
pub fn encode_info_request(name: &str, info_types: &[u16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + name.len() + 2 * info_types.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for info in info_types {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

/// An export name sent with `NBD_OPT_EXPORT_NAME` (the whole option data, no length).
pub fn parse_export_name(data: &[u8]) -> Result<String, ProtoError> {
    if data.len() > MAX_STRING {
        return Err(ProtoError::Invalid(format!(
            "export name of {} bytes",
            data.len()
        )));
    }
    std::str::from_utf8(data)
        .map(str::to_owned)
        .map_err(|_| ProtoError::Invalid("export name is not UTF-8".into()))
}

/// The data of `NBD_INFO_EXPORT`: type, size, transmission flags.
pub fn encode_info_export(size: u64, transmission_flags: u16) -> [u8; 12] {
    let mut out = [0; 12];
    out[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    out[2..10].copy_from_slice(&size.to_be_bytes());
    out[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// The data of `NBD_INFO_BLOCK_SIZE`: type, minimum, preferred, maximum payload.
pub fn encode_info_block_size(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut out = [0; 14];
    out[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out[2..6].copy_from_slice(&minimum.to_be_bytes());
    out[6..10].copy_from_slice(&preferred.to_be_bytes());
    out[10..14].copy_from_slice(&maximum.to_be_bytes());
    out
}

/// The data of a string-valued information reply (`NBD_INFO_NAME`, `_DESCRIPTION`).
pub fn encode_info_string(info_type: u16, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info_type.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// One `NBD_REP_INFO` item a client understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    /// `NBD_INFO_EXPORT`.
    Export { size: u64, transmission_flags: u16 },
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    /// Another type (name, description, or one this code does not know): ignored.
    Other(u16),
}

/// Parses the data of an `NBD_REP_INFO` reply.
pub fn parse_info(data: &[u8]) -> Result<Info, ProtoError> {
    need("NBD_REP_INFO", data, 2)?;
    match be_u16(data, 0) {
        INFO_EXPORT => {
            if data.len() != 12 {
                return Err(ProtoError::Invalid(format!(
                    "NBD_INFO_EXPORT of {}",
                    data.len()
                )));
            }
            Ok(Info::Export {
                size: be_u64(data, 2),
                transmission_flags: be_u16(data, 10),
            })
        }
        INFO_BLOCK_SIZE => {
            if data.len() != 14 {
                return Err(ProtoError::Invalid(format!(
                    "NBD_INFO_BLOCK_SIZE of {}",
                    data.len()
                )));
            }
            Ok(Info::BlockSize {
                minimum: be_u32(data, 2),
                preferred: be_u32(data, 6),
                maximum: be_u32(data, 10),
            })
        }
        other => Ok(Info::Other(other)),
    }
}

/// The answer to `NBD_OPT_EXPORT_NAME`: size, transmission flags and, unless the client
/// set `NBD_FLAG_C_NO_ZEROES`, 124 zero bytes.
pub fn encode_export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let padding = if no_zeroes { 0 } else { EXPORT_NAME_PADDING };
    let mut out = Vec::with_capacity(10 + padding);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out.resize(10 + padding, 0);
    out
}

/// Parses the first 10 bytes of [`encode_export_name_reply`]: (size, flags).
pub fn parse_export_name_reply(bytes: &[u8]) -> Result<(u64, u16), ProtoError> {
    need("NBD_OPT_EXPORT_NAME reply", bytes, 10)?;
    Ok((be_u64(bytes, 0), be_u16(bytes, 8)))
}

// ---- transmission ----------------------------------------------------------------------

/// A transmission request header (a WRITE's payload follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// `NBD_CMD_*`.
    pub command: u16,
    /// The client's opaque cookie (handle), echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Byte length of the range (and of a WRITE's payload).
    pub length: u32,
}

/// Parses a request header; a wrong magic is [`ProtoError::BadMagic`].
pub fn parse_request(bytes: &[u8]) -> Result<RequestHeader, ProtoError> {
    need("request", bytes, REQUEST_HEADER_LEN)?;
    let magic = be_u32(bytes, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "request",
            found: u64::from(magic),
        });
    }
    Ok(RequestHeader {
        flags: be_u16(bytes, 4),
        command: be_u16(bytes, 6),
        cookie: be_u64(bytes, 8),
        offset: be_u64(bytes, 16),
        length: be_u32(bytes, 24),
    })
}

/// A request header on the wire.
pub fn encode_request(request: &RequestHeader) -> [u8; REQUEST_HEADER_LEN] {
    let mut out = [0; REQUEST_HEADER_LEN];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&request.flags.to_be_bytes());
    out[6..8].copy_from_slice(&request.command.to_be_bytes());
    out[8..16].copy_from_slice(&request.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&request.offset.to_be_bytes());
    out[24..28].copy_from_slice(&request.length.to_be_bytes());
    out
}

/// A simple reply header (a successful READ's data follows it).
pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut out = [0; SIMPLE_REPLY_LEN];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A parsed simple reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    /// 0, or an `NBD_E*` error.
    pub error: u32,
    /// The cookie of the request this answers.
    pub cookie: u64,
}

/// Parses a simple reply header; a structured reply's magic is a [`ProtoError::BadMagic`]
/// (a client that did not negotiate structured replies must never see one).
pub fn parse_simple_reply(bytes: &[u8]) -> Result<SimpleReply, ProtoError> {
    need("simple reply", bytes, SIMPLE_REPLY_LEN)?;
    let magic = be_u32(bytes, 0);
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "simple reply",
            found: u64::from(magic),
        });
    }
    Ok(SimpleReply {
        error: be_u32(bytes, 4),
        cookie: be_u64(bytes, 8),
    })
}

/// A structured reply chunk header: magic, flags, type, cookie, payload length.
pub fn encode_chunk_header(
    flags: u16,
    reply_type: u16,
    cookie: u64,
    length: u32,
) -> [u8; CHUNK_HEADER_LEN] {
    let mut out = [0; CHUNK_HEADER_LEN];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&reply_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&length.to_be_bytes());
    out
}

/// A parsed structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `NBD_REPLY_FLAG_*`.
    pub flags: u16,
    /// `NBD_REPLY_TYPE_*`.
    pub reply_type: u16,
    /// The cookie of the request this answers.
    pub cookie: u64,
    /// Bytes of payload that follow.
    pub length: u32,
}

/// Parses a structured reply chunk header.
pub fn parse_chunk_header(bytes: &[u8]) -> Result<ChunkHeader, ProtoError> {
    need("structured reply chunk", bytes, CHUNK_HEADER_LEN)?;
    let magic = be_u32(bytes, 0);
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(ProtoError::BadMagic {
            what: "structured reply",
            found: u64::from(magic),
        });
    }
    Ok(ChunkHeader {
        flags: be_u16(bytes, 4),
        reply_type: be_u16(bytes, 6),
        cookie: be_u64(bytes, 8),
        length: be_u32(bytes, 16),
    })
}

/// Writes the prefix of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk carrying `data_len` bytes
/// at `offset` into `out[..OFFSET_DATA_PREFIX_LEN]`, so the data can be read into the
/// same buffer right after it and the chunk sent with one write. `data_len` must be at
/// most `u32::MAX - 8` (a READ is at most [`MAX_PAYLOAD`]).
pub fn write_offset_data_prefix(
    out: &mut [u8; OFFSET_DATA_PREFIX_LEN],
    flags: u16,
    cookie: u64,
    offset: u64,
    data_len: u32,
) {
    let header = encode_chunk_header(flags, REPLY_TYPE_OFFSET_DATA, cookie, data_len + 8);
    out[..CHUNK_HEADER_LEN].copy_from_slice(&header);
    out[CHUNK_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
}

/// A whole `NBD_REPLY_TYPE_ERROR` chunk with the DONE flag: `error` and a message
/// (truncated to [`MAX_STRING`] bytes at a character boundary).
pub fn encode_error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let mut cut = message.len().min(MAX_STRING);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = &message.as_bytes()[..cut];
    let payload_len = 6 + message.len();
    let mut out = Vec::with_capacity(CHUNK_HEADER_LEN + payload_len);
    out.extend_from_slice(&encode_chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        payload_len as u32,
    ));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A name for an `NBD_CMD_*` value, for logs.
pub fn command_name(command: u16) -> CommandName {
    CommandName(command)
}

/// Displays an `NBD_CMD_*` value by name (see [`command_name`]).
#[derive(Debug, Clone, Copy)]
pub struct CommandName(u16);

impl fmt::Display for CommandName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            CMD_READ => "READ",
            CMD_WRITE => "WRITE",
            CMD_DISC => "DISC",
            CMD_FLUSH => "FLUSH",
            CMD_TRIM => "TRIM",
            CMD_CACHE => "CACHE",
            CMD_WRITE_ZEROES => "WRITE_ZEROES",
            CMD_BLOCK_STATUS => "BLOCK_STATUS",
            other => return write!(f, "command {other}"),
        };
        f.write_str(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_spell_their_ascii_names() {
        assert_eq!(&NBD_MAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
        assert_eq!(OPTION_REPLY_MAGIC, 0x3e889045565a9);
    }

    #[test]
    fn greeting_round_trips_and_refuses_oldstyle() {
        let greeting = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(parse_greeting(&greeting), Ok(3));
        let mut oldstyle = greeting;
        oldstyle[8..16].copy_from_slice(&0x0000_4202_8186_1253_u64.to_be_bytes());
        assert!(matches!(
            parse_greeting(&oldstyle),
            Err(ProtoError::BadMagic { .. })
        ));
        assert!(matches!(
            parse_greeting(&greeting[..5]),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn request_round_trips_and_bad_magic_is_refused() {
        let request = RequestHeader {
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let bytes = encode_request(&request);
        assert_eq!(&bytes[..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(parse_request(&bytes), Ok(request));
        let mut bad = bytes;
        bad[0] ^= 0xff;
        assert!(matches!(
            parse_request(&bad),
            Err(ProtoError::BadMagic { .. })
        ));
        assert!(matches!(
            parse_request(&bytes[..27]),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn option_messages_round_trip() {
        let option = encode_option(OPT_GO, &encode_info_request("disk", &[INFO_BLOCK_SIZE]));
        let header = parse_option_header(&option).unwrap();
        assert_eq!(
            header,
            OptionHeader {
                option: OPT_GO,
                length: 4 + 4 + 2 + 2
            }
        );
        let request = parse_info_request(&option[OPTION_HEADER_LEN..]).unwrap();
        assert_eq!(request.name, "disk");
        assert_eq!(request.info_types, vec![INFO_BLOCK_SIZE]);

        let reply = encode_option_reply(OPT_GO, REP_INFO, &encode_info_export(1 << 30, 0x15b));
        let header = parse_option_reply_header(&reply).unwrap();
        assert_eq!(header.option, OPT_GO);
        assert_eq!(header.reply_type, REP_INFO);
        assert_eq!(header.length, 12);
        assert_eq!(
            parse_info(&reply[OPTION_REPLY_HEADER_LEN..]),
            Ok(Info::Export {
                size: 1 << 30,
                transmission_flags: 0x15b
            })
        );
        assert_eq!(
            parse_info(&encode_info_block_size(1, 4096, MAX_PAYLOAD)),
            Ok(Info::BlockSize {
                minimum: 1,
                preferred: 4096,
                maximum: MAX_PAYLOAD
            })
        );
        assert_eq!(
            parse_info(&encode_info_string(INFO_NAME, "x")),
            Ok(Info::Other(INFO_NAME))
        );
        assert!(parse_info(&[0, 0, 1]).is_err());
    }

    #[test]
    fn malformed_info_requests_are_invalid_not_panics() {
        // Name length larger than the data.
        let mut data = encode_info_request("disk", &[]);
        data[3] = 200;
        assert!(matches!(
            parse_info_request(&data),
            Err(ProtoError::Invalid(_))
        ));
        // Name length near u32::MAX (no overflow).
        data[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&data).is_err());
        // Count that does not match the items.
        let mut data = encode_info_request("", &[INFO_EXPORT, INFO_NAME]);
        data.pop();
        assert!(parse_info_request(&data).is_err());
        // Too short, and not UTF-8.
        assert!(parse_info_request(&[0, 0, 0]).is_err());
        assert!(parse_info_request(&[0, 0, 0, 1, 0xff, 0, 0]).is_err());
        assert_eq!(parse_info_request(&[0, 0, 0, 0, 0, 0]).unwrap().name, "");
        // Every short prefix of a valid request fails cleanly.
        let valid = encode_info_request("name", &[1, 2, 3]);
        for len in 0..valid.len() {
            assert!(parse_info_request(&valid[..len]).is_err(), "prefix {len}");
        }
    }

    #[test]
    fn export_name_reply_honours_no_zeroes() {
        let with = encode_export_name_reply(512, FLAG_HAS_FLAGS, false);
        assert_eq!(with.len(), 10 + EXPORT_NAME_PADDING);
        assert!(with[10..].iter().all(|&b| b == 0));
        let without = encode_export_name_reply(512, FLAG_HAS_FLAGS, true);
        assert_eq!(without.len(), 10);
        assert_eq!(parse_export_name_reply(&without), Ok((512, FLAG_HAS_FLAGS)));
        assert_eq!(parse_export_name(b"vol"), Ok("vol".to_owned()));
        assert!(parse_export_name(&[0xc3]).is_err());
    }

    #[test]
    fn simple_reply_round_trips() {
        let reply = encode_simple_reply(EINVAL, 7);
        assert_eq!(
            parse_simple_reply(&reply),
            Ok(SimpleReply {
                error: EINVAL,
                cookie: 7
            })
        );
        let chunk = encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 7, 0);
        assert!(matches!(
            parse_simple_reply(&chunk),
            Err(ProtoError::BadMagic { .. })
        ));
    }

    #[test]
    fn offset_data_chunk_layout() {
        let mut prefix = [0; OFFSET_DATA_PREFIX_LEN];
        write_offset_data_prefix(&mut prefix, REPLY_FLAG_DONE, 9, 4096, 512);
        let header = parse_chunk_header(&prefix).unwrap();
        assert_eq!(
            header,
            ChunkHeader {
                flags: REPLY_FLAG_DONE,
                reply_type: REPLY_TYPE_OFFSET_DATA,
                cookie: 9,
                length: 520
            }
        );
        assert_eq!(be_u64(&prefix, CHUNK_HEADER_LEN), 4096);
    }

    #[test]
    fn error_chunk_layout_and_message_cut() {
        let chunk = encode_error_chunk(3, EIO, "disk on fire");
        let header = parse_chunk_header(&chunk).unwrap();
        assert_eq!(header.reply_type, REPLY_TYPE_ERROR);
        assert_eq!(header.flags, REPLY_FLAG_DONE);
        assert_eq!(header.length as usize, chunk.len() - CHUNK_HEADER_LEN);
        assert_eq!(be_u32(&chunk, CHUNK_HEADER_LEN), EIO);
        assert_eq!(be_u16(&chunk, CHUNK_HEADER_LEN + 4), 12);
        assert_eq!(&chunk[CHUNK_HEADER_LEN + 6..], b"disk on fire");
        // A long message of multi-byte characters is cut at a boundary, within limits.
        let long = "é".repeat(MAX_STRING);
        let chunk = encode_error_chunk(3, EIO, &long);
        let message_len = be_u16(&chunk, CHUNK_HEADER_LEN + 4) as usize;
        assert!(message_len <= MAX_STRING);
        assert!(std::str::from_utf8(&chunk[CHUNK_HEADER_LEN + 6..]).is_ok());
    }

    #[test]
    fn parsers_never_panic_on_short_or_random_input() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..64 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = parse_greeting(&bytes);
            let _ = parse_option_header(&bytes);
            let _ = parse_option_reply_header(&bytes);
            let _ = parse_info_request(&bytes);
            let _ = parse_info(&bytes);
            let _ = parse_request(&bytes);
            let _ = parse_simple_reply(&bytes);
            let _ = parse_chunk_header(&bytes);
            let _ = parse_export_name(&bytes);
            let _ = parse_export_name_reply(&bytes);
        }
    }

    #[test]
    fn command_names() {
        assert_eq!(command_name(CMD_WRITE_ZEROES).to_string(), "WRITE_ZEROES");
        assert_eq!(command_name(99).to_string(), "command 99");
    }
}
