//! The built-in byte tokenizer: 256 byte ids, then Qwen3's specials in [`Special::ALL`] order.
//! Any text round-trips exactly, and the vocabulary (266) fits a tiny model's 512 rows.

use super::Special;

pub const BYTE_VOCAB_SIZE: usize = 256 + Special::ALL.len();

pub(super) fn special_id(special: Special) -> u32 {
    let index = Special::ALL.iter().position(|&s| s == special).unwrap_or(0);
    256 + index as u32
}

fn special_at(rest: &str, with_control: bool) -> Option<Special> {
    if !rest.starts_with('<') {
        return None;
    }
    Special::ALL.iter().copied().find(|s| (with_control || !s.is_control()) && rest.starts_with(s.text()))
}

/// [`encode`] with control tokens recognised, and each id's byte range.
pub(super) fn encode_with_offsets(text: &str) -> (Vec<u32>, Vec<(usize, usize)>) {
    let ids = encode(text, true);
    let mut offsets = Vec::with_capacity(ids.len());
    let mut at = 0;
    for &id in &ids {
        let len = if id < 256 { 1 } else { Special::ALL[id as usize - 256].text().len() };
        offsets.push((at, at + len));
        at += len;
    }
    (ids, offsets)
}

pub(super) fn encode(text: &str, with_control: bool) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        // `<` is ASCII, so a special can only start on a char boundary.
        if let Some(special) = text.get(i..).and_then(|rest| special_at(rest, with_control)) {
            ids.push(special_id(special));
            i += special.text().len();
        } else {
            ids.push(u32::from(text.as_bytes()[i]));
            i += 1;
        }
    }
    ids
}

pub(super) fn decode(ids: &[u32], skip_control: bool) -> Result<String, String> {
    let mut bytes = Vec::with_capacity(ids.len());
    for &id in ids {
        if id < 256 {
            bytes.push(id as u8);
            continue;
        }
        let special = Special::ALL
            .get(id as usize - 256)
            .ok_or_else(|| format!("id {id} is outside the byte vocabulary of {BYTE_VOCAB_SIZE}"))?;
        if !(skip_control && special.is_control()) {
            bytes.extend_from_slice(special.text().as_bytes());
        }
    }
    // A model can emit a cut UTF-8 sequence; show it rather than fail.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
