//! memcached's meta commands (placeholder until the module lands).

use super::{Line, Step};
use crate::shared::Shared;

pub fn handle(_shared: &Shared, line: Line<'_>, _input: &[u8], out: &mut Vec<u8>) -> Step {
    out.extend_from_slice(b"ERROR\r\n");
    Step::Done { consumed: line.consumed }
}
