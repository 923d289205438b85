//! KTO's examples from preference data: each pair gives a desirable example (its chosen
//! answer) and an undesirable one (its rejected answer), scored on their own, as TRL's
//! `unpair_preference_dataset` does; and the mismatched sequences its reference point is
//! estimated on, each prompt with the completion of an example of another pair.

use super::pack::Seq;
use crate::batch::{IGNORE, PackedBatch, PreferenceBatch};

/// One example: the prompt and answer tokens with the answer's learned tokens marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub seq: Seq,
    pub desirable: bool,
    /// Tokens before the first learned one: the prompt.
    prompt_len: usize,
}

/// The examples of `batches`, pair by pair: chosen (desirable), then rejected.
pub fn unpair(batches: &[PreferenceBatch]) -> Result<Vec<Example>, String> {
    let mut out = Vec::new();
    for b in batches {
        let (chosen, rejected) = (rows(&b.chosen)?, rows(&b.rejected)?);
        if chosen.len() != rejected.len() {
            return Err(format!("{} chosen rows but {} rejected", chosen.len(), rejected.len()));
        }
        for (c, r) in chosen.into_iter().zip(rejected) {
            out.push(example(c, true)?);
            out.push(example(r, false)?);
        }
    }
    Ok(out)
}

fn example(seq: Seq, desirable: bool) -> Result<Example, String> {
    let prompt_len = seq.learned.iter().position(|&l| l).ok_or("an answer without learned tokens")?;
    if prompt_len == 0 {
        return Err("an example with no prompt".into());
    }
    Ok(Example { seq, desirable, prompt_len })
}

/// Each example's prompt with the answer of the same side of the next pair (pairs are two
/// examples apart), so no prompt meets its own answer; needs two pairs at least.
pub fn mismatched(examples: &[Example]) -> Result<Vec<Seq>, String> {
    let n = examples.len();
    if n < 4 {
        return Err(format!(
            "KTO estimates its reference point from prompts paired with other prompts' answers, which takes at \
             least 2 pairs a step; this step has {}: raise train.batch.per_device or grad_accum",
            n / 2
        ));
    }
    Ok((0..n)
        .map(|k| {
            let (a, b) = (&examples[k], &examples[(k + 2) % n]);
            Seq {
                tokens: [&a.seq.tokens[..a.prompt_len], &b.seq.tokens[b.prompt_len..]].concat(),
                learned: [&a.seq.learned[..a.prompt_len], &b.seq.learned[b.prompt_len..]].concat(),
            }
        })
        .collect())
}

/// The documents of an unpacked batch (one per row): tokens, and which are learned (a token
/// is learned when the position before it carries it as its label).
fn rows(b: &PackedBatch) -> Result<Vec<Seq>, String> {
    let t = b.seq_len;
    (0..b.batch)
        .map(|r| {
            let span = r * t..(r + 1) * t;
            let segments = &b.segment_ids[span.clone()];
            let len = segments.iter().take_while(|&&s| s == 1).count();
            if segments[len..].iter().any(|&s| s != 0) {
                return Err(format!("row {r} packs more than one answer"));
            }
            let ids = &b.input_ids[span.clone()][..len];
            let labels = &b.labels[span][..len];
            let mut learned = vec![false; len];
            for p in 1..len {
                learned[p] = labels[p - 1] != IGNORE;
            }
            Ok(Seq { tokens: ids.to_vec(), learned })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ids: &[u32], first_learned: usize, width: usize) -> PackedBatch {
        let n = ids.len();
        let labels = (0..width)
            .map(|t| if t + 1 < n && t + 1 >= first_learned { i64::from(ids[t + 1]) } else { IGNORE })
            .collect();
        PackedBatch {
            batch: 1,
            seq_len: width,
            input_ids: ids.iter().copied().chain(std::iter::repeat_n(0, width - n)).collect(),
            position_ids: (0..width as u32).collect(),
            segment_ids: std::iter::repeat_n(1, n).chain(std::iter::repeat_n(0, width - n)).collect(),
            labels,
        }
    }

    fn pair(prompt: &[u32], chosen: &[u32], rejected: &[u32]) -> PreferenceBatch {
        PreferenceBatch {
            chosen: row(&[prompt, chosen].concat(), prompt.len(), 8),
            rejected: row(&[prompt, rejected].concat(), prompt.len(), 8),
        }
    }

    #[test]
    fn pairs_become_two_examples_and_mismatches_cross_pairs() {
        let batches = [pair(&[1, 2], &[3, 4], &[5]), pair(&[6, 7, 8], &[9], &[10, 11])];
        let ex = unpair(&batches).unwrap();
        assert_eq!(ex.iter().map(|e| e.desirable).collect::<Vec<_>>(), [true, false, true, false]);
        assert_eq!(ex[0].seq, Seq::completion(&[1, 2], &[3, 4]));
        assert_eq!(ex[3].seq, Seq::completion(&[6, 7, 8], &[10, 11]));
        let kl = mismatched(&ex).unwrap();
        assert_eq!(kl[0], Seq::completion(&[1, 2], &[9]));
        assert_eq!(kl[1], Seq::completion(&[1, 2], &[10, 11]));
        assert_eq!(kl[2], Seq::completion(&[6, 7, 8], &[3, 4]));
        let err = mismatched(&ex[..2]).unwrap_err();
        assert!(err.contains("at least 2 pairs"), "{err}");
    }
}
