use std::collections::HashSet;

use super::*;
use crate::data::jsonl::parse_line;
use crate::data::template::{ChatTemplate, Targets, encode_pieces, pieces_to_string};
use crate::data::tokenizer::Tokenizer;

fn params(seed: u64, count: u32) -> TaskParams {
    TaskParams::new(seed, count)
}

#[test]
fn same_seed_same_tasks_other_seed_other_tasks() {
    assert_eq!(generate(&params(7, 200)), generate(&params(7, 200)));
    assert_eq!(generate_jsonl(&params(7, 50), DataFormat::Chat), generate_jsonl(&params(7, 50), DataFormat::Chat));
    assert_ne!(generate(&params(7, 200)), generate(&params(8, 200)));
    // A longer run starts with the shorter one.
    assert_eq!(generate(&params(7, 300))[..200], generate(&params(7, 200))[..]);
}

#[test]
fn pinned_first_tasks_of_seed_7() {
    // Changing this means GENERATOR_VERSION must change too.
    let tasks = generate(&params(7, 40));
    let first = &tasks[0];
    assert_eq!(
        (first.family, first.prompt.as_str(), first.answer.text()),
        (TaskFamily::CountLetters, "How many letters in nddatyb?", "7".into())
    );
    let tool = tasks.iter().find(|t| t.family == TaskFamily::Weather).unwrap();
    assert_eq!(tool.prompt, "I am Buno. How is the weather?");
    assert_eq!(tool.answer.text(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>");
}

#[test]
fn every_family_appears_and_answers_are_right() {
    let tasks = generate(&TaskParams { multi_arg_tools: true, ..params(1, 3000) });
    let families: HashSet<TaskFamily> = tasks.iter().map(|t| t.family).collect();
    assert_eq!(families.len(), 8, "{families:?}");
    for t in &tasks {
        assert!(t.is_correct(&t.answer.text()), "{t:?}");
        assert!(!t.is_correct(&t.wrong.text()), "wrong answer scores: {t:?}");
        let answer = t.answer.text();
        let check = |ok: bool| assert!(ok, "{t:?}");
        let word = |prefix: &str| t.prompt[prefix.len()..].trim_end_matches('?').to_owned();
        match t.family {
            TaskFamily::Parity => {
                let n: u64 = t.prompt["Is ".len()..].split(' ').next().unwrap().parse().unwrap();
                check(answer == if n.is_multiple_of(2) { "even" } else { "odd" });
            }
            TaskFamily::CountLetters => check(answer == word("How many letters in ").len().to_string()),
            TaskFamily::LastLetter => check(answer == word("Last letter of ")[word("Last letter of ").len() - 1..]),
            TaskFamily::Review => check(answer == "positive" || answer == "negative"),
            TaskFamily::Weather | TaskFamily::Time | TaskFamily::News => {
                let tool = match t.family {
                    TaskFamily::Weather => "get_weather",
                    TaskFamily::Time => "get_time",
                    _ => "get_news",
                };
                check(answer == format!("<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {{}}}}\n</tool_call>"));
            }
            TaskFamily::Convert => check(answer.contains("\"arguments\": {\"amount\": ")),
        }
    }
    // Reviews are decided by their last word, and both answers are common.
    let reviews: Vec<&Task> = tasks.iter().filter(|t| t.family == TaskFamily::Review).collect();
    let positive = reviews.iter().filter(|t| t.answer.text() == "positive").count();
    assert!(positive * 3 > reviews.len() && positive * 3 < reviews.len() * 2, "{positive} of {}", reviews.len());
}

#[test]
fn examples_fit_a_tiny_byte_model() {
    let tokenizer = Tokenizer::byte();
    for multi_arg_tools in [false, true] {
        let p = TaskParams { multi_arg_tools, ..params(3, 2000) };
        let longest = generate(&p)
            .iter()
            .map(|t| {
                let pieces = ChatTemplate::COMPACT.render(&t.conversation(), Targets::AssistantFrom(0)).unwrap().pieces;
                encode_pieces(&tokenizer, &pieces).unwrap().ids.len() + 1 // + eos
            })
            .max()
            .unwrap();
        assert!(longest <= p.max_byte_tokens(), "{longest} > {}", p.max_byte_tokens());
    }
}

#[test]
fn records_read_back_as_the_same_conversation() {
    let template = ChatTemplate::QWEN3;
    for task in generate(&TaskParams { multi_arg_tools: true, ..params(5, 300) }) {
        let want = pieces_to_string(&template.render(&task.conversation(), Targets::AssistantFrom(0)).unwrap().pieces);
        for format in [DataFormat::Chat, DataFormat::Instruction] {
            let line = task.record(format).to_string();
            let Some(Example::Chat(conv)) = parse_line(line.as_bytes(), format).unwrap() else { panic!("{line}") };
            assert_eq!(
                pieces_to_string(&template.render(&conv, Targets::AssistantFrom(0)).unwrap().pieces),
                want,
                "{line}"
            );
        }
        let line = task.record(DataFormat::Preference).to_string();
        let parsed = parse_line(line.as_bytes(), DataFormat::Preference).unwrap().unwrap();
        assert_eq!(parsed, task.example(DataFormat::Preference));
    }
}

#[test]
fn prompts_rarely_repeat() {
    // The demo's corpora (recipes/tiny_cpu_pretrain.yaml, tiny_cpu_lora.yaml): a held-out
    // prompt of the LoRA run is almost never a training prompt of its base, so held-out
    // exact match measures what was learnt, not what was seen.
    let key = |t: &Task| format!("{:?}{}", t.system, t.prompt);
    let no_tools =
        Families::of(&[TaskFamily::Parity, TaskFamily::CountLetters, TaskFamily::LastLetter, TaskFamily::Review]);
    let pretrain: HashSet<String> =
        generate(&TaskParams { families: no_tools, ..params(11, 20_000) }).iter().map(key).collect();
    let tuning = generate(&params(7, 4000));
    let unique: HashSet<String> = tuning.iter().map(key).collect();
    assert!(unique.len() > 3800, "too many duplicates: {} unique of 4000", unique.len());
    let seen = tuning.iter().filter(|t| pretrain.contains(&key(t))).count();
    assert!(seen * 100 < tuning.len(), "{seen} of {} tuning prompts are in the pretraining corpus", tuning.len());
}

#[test]
fn every_generated_prompt_names_its_family() {
    for task in generate(&TaskParams { multi_arg_tools: true, ..params(9, 600) }) {
        assert_eq!(TaskFamily::of_prompt(&task.prompt), Some(task.family), "{}", task.prompt);
    }
    for other in ["What is love?", "Is it even or odd?", "I am Tavo. Hi?", "Hello", "Review:x", ""] {
        assert_eq!(TaskFamily::of_prompt(other), None, "{other}");
    }
}

#[test]
fn a_family_subset_is_the_whole_mix_with_the_rest_left_out() {
    let some = [TaskFamily::Parity, TaskFamily::Review];
    let subset = generate(&TaskParams { families: Families::of(&some), ..params(4, 300) });
    assert_eq!(subset.len(), 300);
    assert!(subset.iter().all(|t| some.contains(&t.family)));
    let whole: Vec<Task> = generate(&params(4, 3000)).into_iter().filter(|t| some.contains(&t.family)).collect();
    assert_eq!(subset[..], whole[..300]);
    // `convert` alone needs multi-argument tools; without them there is nothing to draw.
    let convert = TaskParams { families: Families::of(&[TaskFamily::Convert]), ..params(4, 10) };
    assert!(!convert.can_draw() && generate(&convert).is_empty());
    let multi = TaskParams { multi_arg_tools: true, ..convert };
    assert_eq!(generate(&multi).len(), 10);
}
