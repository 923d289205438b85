"""lm-evaluation-harness's IFEval scoring of given cases, for tests/tests/ifeval.rs.

Reads JSON lines from argv[1] and writes one JSON line per input to argv[2]:
  {"case": {key, prompt, instruction_id_list, kwargs, response}}
      -> the harness's `utils.process_results(doc, [response])` (its four fields)
  {"text": t}
      -> what its checks count with: `count_words`, `count_sentences`, `nltk.sent_tokenize`,
         `nltk.word_tokenize`
  {"language": t}
      -> `langdetect.detect(t)` (or null where it raises, as on text with no letters)

langdetect is random unless seeded and the harness does not seed it; seeded here so that a run
is reproducible.
"""

import json
import sys

import langdetect
import nltk
from langdetect import DetectorFactory

from lm_eval.tasks.ifeval import instructions_util, utils

DetectorFactory.seed = 0


def answer(item):
    if "case" in item:
        c = item["case"]
        doc = {k: c[k] for k in ("key", "prompt", "instruction_id_list", "kwargs")}
        return utils.process_results(doc, [c["response"]])
    if "text" in item:
        t = item["text"]
        return {
            "words": instructions_util.count_words(t),
            "sentences": instructions_util.count_sentences(t),
            "sent_tokenize": nltk.sent_tokenize(t),
            "word_tokenize": nltk.word_tokenize(t),
        }
    try:
        return {"language": langdetect.detect(item["language"])}
    except langdetect.LangDetectException:
        return {"language": None}


def main(src, dst):
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            out.write(json.dumps(answer(json.loads(line)), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
