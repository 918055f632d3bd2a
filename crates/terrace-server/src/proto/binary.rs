//! memcached's binary protocol (placeholder until the module lands).

use super::Step;
use crate::shared::Shared;

/// First byte of every binary request.
pub const REQUEST_MAGIC: u8 = 0x80;

pub fn handle(_shared: &Shared, _input: &[u8], _out: &mut Vec<u8>) -> Step {
    Step::Close { consumed: 0 }
}
