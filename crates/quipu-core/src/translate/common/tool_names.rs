//! Tool names as the upstream protocol allows them: at most [`MAX_TOOL_NAME`] bytes, a longer
//! client name shortened stably ([`shorten_tool_name`]). The messages format shortens a
//! declared tool's name, the Responses API a flattened `namespace__name`; each restores the
//! client's name in its answers.

use sha2::{Digest, Sha256};

/// The longest function name the upstream protocol allows.
pub const MAX_TOOL_NAME: usize = 64;

/// A stable ≤ 64-byte name for a longer tool name: its first 55 bytes (cut on a character
/// boundary), `_`, and 8 hex digits of its SHA-256. The same name always gives the same result,
/// so a conversation's history and tools agree across requests (and the prefix cache holds).
pub fn shorten_tool_name(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut cut = MAX_TOOL_NAME - 9;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut s = String::with_capacity(MAX_TOOL_NAME);
    s.push_str(&name[..cut]);
    s.push('_');
    let mut hex = [0u8; 8];
    let first4 = [digest[0], digest[1], digest[2], digest[3]];
    crate::ascii::fill_hex(&mut hex, u64::from(u32::from_be_bytes(first4)));
    s.extend(hex.iter().map(|&b| char::from(b)));
    s
}
