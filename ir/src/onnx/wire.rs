//! A pass over protobuf's wire format before decoding, for what the decoder does not bound:
//! it skips an unknown group by recursing once per nested group, so a few hundred kilobytes
//! of nested start-group tags overflow the stack (the process aborts). Sub-messages are
//! bounded by the decoder itself (100 levels).

/// Nested groups allowed, as many as the decoder allows nested messages.
pub(crate) const MAX_GROUP_DEPTH: u32 = 100;

/// Messages looked into (the decoder refuses deeper ones).
const MAX_MESSAGE_DEPTH: u32 = 100;

/// The byte offset of a group nested deeper than [`MAX_GROUP_DEPTH`], if any. Bytes that
/// are not a message are not looked into: the decoder reads them as bytes or fails on them.
pub(crate) fn too_deep_group(bytes: &[u8]) -> Option<usize> {
    scan(bytes, 0, 0)
}

/// Walks the fields of the message in `bytes` (at `base` in the file).
fn scan(bytes: &[u8], base: usize, depth: u32) -> Option<usize> {
    let mut at = 0;
    while at < bytes.len() {
        let (tag, next) = varint(bytes, at)?;
        at = next;
        match tag & 7 {
            2 => {
                let (len, next) = varint(bytes, at)?;
                let end = next.checked_add(usize::try_from(len).ok()?)?;
                let payload = bytes.get(next..end)?;
                // A payload may be a sub-message, which the decoder parses in turn.
                if depth < MAX_MESSAGE_DEPTH {
                    if let Some(deep) = scan(payload, base + next, depth + 1) {
                        return Some(deep);
                    }
                }
                at = end;
            }
            3 => match skip_group(bytes, at) {
                Skipped::Ends(next) => at = next,
                Skipped::TooDeep(offset) => return Some(base + offset),
                Skipped::Malformed => return None,
            },
            _ => at = skip_scalar(bytes, at, tag & 7)?,
        }
    }
    None
}

enum Skipped {
    Ends(usize),
    TooDeep(usize),
    Malformed,
}

/// Skips a group whose start tag ends before `at`, counting its nesting without recursion.
fn skip_group(bytes: &[u8], mut at: usize) -> Skipped {
    let mut depth = 1u32;
    while depth > 0 {
        let Some((tag, next)) = varint(bytes, at) else {
            return Skipped::Malformed;
        };
        at = next;
        match tag & 7 {
            3 => {
                depth += 1;
                if depth > MAX_GROUP_DEPTH {
                    return Skipped::TooDeep(at);
                }
            }
            4 => depth -= 1,
            2 => {
                let Some((len, next)) = varint(bytes, at) else {
                    return Skipped::Malformed;
                };
                match usize::try_from(len).ok().and_then(|l| next.checked_add(l)) {
                    Some(end) if end <= bytes.len() => at = end,
                    _ => return Skipped::Malformed,
                }
            }
            wire => match skip_scalar(bytes, at, wire) {
                Some(next) => at = next,
                None => return Skipped::Malformed,
            },
        }
    }
    Skipped::Ends(at)
}

/// Past a varint, fixed64 or fixed32 value at `at`; `None` for anything else.
fn skip_scalar(bytes: &[u8], at: usize, wire: u64) -> Option<usize> {
    let end = match wire {
        0 => return varint(bytes, at).map(|(_, next)| next),
        1 => at.checked_add(8)?,
        5 => at.checked_add(4)?,
        _ => return None,
    };
    (end <= bytes.len()).then_some(end)
}

/// The varint at `at` and the offset after it.
fn varint(bytes: &[u8], mut at: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(at)?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field 1 as `n` nested groups.
    fn nested(n: usize) -> Vec<u8> {
        let mut bytes = vec![0x0b; n];
        bytes.extend(std::iter::repeat_n(0x0c, n));
        bytes
    }

    #[test]
    fn deep_groups_are_found_and_shallow_ones_pass() {
        assert_eq!(too_deep_group(&nested(100)), None);
        assert_eq!(too_deep_group(&nested(200_000)), Some(101));
        // Inside a length-delimited field (a sub-message) too, at its place in the file.
        let inner = nested(1000);
        let mut outer = vec![0x3a];
        let mut len = inner.len();
        while len >= 0x80 {
            outer.push((len as u8) | 0x80);
            len >>= 7;
        }
        outer.push(len as u8);
        let header = outer.len();
        outer.extend(inner);
        assert_eq!(too_deep_group(&outer), Some(header + 101));
    }
}
