//! The keys a buffered request is about to read, found before it is handled, so that a
//! worker can have their flash items read without waiting for the device in its own loop
//! (`Session`: on the io_uring worker's ring, or on an epoll worker's blocking pool).
//!
//! Only gets are looked at, and only when cheap to tell: a text `get`, `gets`, `bget`,
//! `gat`, `gats` or meta `mg` whose whole line is buffered (an `mg` with base64 keys
//! excepted), and a binary GET or GAT in any variant whose key is here. Everything else
//! that reads an item reads flash inline: writes that need the old value (incr/decr,
//! append/prepend, `ma`), `touch`, a line longer than `MAX_LINE`. Finding no key is
//! never wrong, only slower: the handler then reads as it always does.

use super::{binary, split_line, Protocol};

/// The keys the request at the start of `input` reads, each passed to `key`.
pub fn for_each_key(proto: Protocol, input: &[u8], mut key: impl FnMut(&[u8])) {
    match proto {
        Protocol::Binary => {
            if let Some(k) = binary::get_key(input) {
                key(k);
            }
        }
        Protocol::Text => {
            let Ok(line) = split_line(input) else {
                return;
            };
            // The line is read as a C string (as the text handler reads it).
            let text = match line.text.iter().position(|&b| b == 0) {
                Some(nul) => &line.text[..nul],
                None => line.text,
            };
            let mut tokens = text.split(|&b| b == b' ').filter(|t| !t.is_empty());
            let keys_from = match tokens.next() {
                Some(b"get" | b"gets" | b"bget") => 0,
                // The exptime comes first.
                Some(b"gat" | b"gats") => 1,
                Some(b"mg") => {
                    let mut rest = tokens.clone();
                    let Some(k) = rest.next() else {
                        return;
                    };
                    if !rest.any(|flag| flag == b"b") {
                        key(k);
                    }
                    return;
                }
                _ => return,
            };
            tokens.skip(keys_from).for_each(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(proto: Protocol, input: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for_each_key(proto, input, |k| out.push(k.to_vec()));
        out
    }

    #[test]
    fn text_and_meta_gets_name_their_keys() {
        let t = Protocol::Text;
        assert_eq!(
            keys(t, b"get a bb  c\r\n"),
            [b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            keys(t, b"gats 100 k1 k2\r\nset x"),
            [b"k1".to_vec(), b"k2".to_vec()]
        );
        assert_eq!(keys(t, b"mg key v t\r\n"), [b"key".to_vec()]);
        assert!(
            keys(t, b"mg a2V5 b v\r\n").is_empty(),
            "base64 keys are left alone"
        );
        assert!(keys(t, b"get a b").is_empty(), "an incomplete line");
        assert!(keys(t, b"set a 0 0 1\r\nx\r\n").is_empty());
        assert!(keys(t, b"incr a 1\r\n").is_empty());
        assert_eq!(keys(t, b"get a\0b\r\n"), [b"a".to_vec()]);
    }

    #[test]
    fn binary_gets_name_their_key() {
        let mut req = vec![0x80, 0x0c, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3];
        req.resize(24, 0);
        req.extend_from_slice(b"abc");
        assert_eq!(keys(Protocol::Binary, &req), [b"abc".to_vec()]);
        assert!(
            keys(Protocol::Binary, &req[..25]).is_empty(),
            "key not all here"
        );
        req[1] = 0x01; // SET
        assert!(keys(Protocol::Binary, &req).is_empty());
    }
}
