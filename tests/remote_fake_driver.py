"""A driver that follows the remote_worker interface without a model (stdlib + torch only).

The worker loads it by file path (``driver: /abs/remote_fake_driver.py:FakeDriver``),
so the protocol, the client and the adapter's scoring run through a real
subprocess. Its vocabulary has the traps of real checkpoints: an id that
cannot be decoded alone (Qwen's ``<img>``), ``ności`` (a "no" prefix that is
not "no"), and logits wider than the tokenizer whose padding column is the
largest of all.
"""

import math
import os
import sys

import torch

TOKENS = ["Yes", " yes", "No", " no", "ności", "A", " B", "C", "<img>", "Yesterday", "maybe", "</s>"]
UNDECODABLE = 8
END = 11  # the end-of-sequence token: on images named "end*" the answer ends at once
PADDING_COLUMNS = 2


class FakeTokenizer:
    def __len__(self):
        return len(TOKENS)

    def decode(self, ids):
        if ids == [UNDECODABLE]:
            raise ValueError("Unclosed image token")
        return "".join(TOKENS[i] for i in ids)


class FakeDriver:
    """Logits favour " yes" on images whose name contains "yes", else "No"; "C" on MC prompts."""

    def __init__(self, path, revision=None, dtype="bfloat16", device="cuda", **options):
        if options.get("crash_on_load"):
            raise RuntimeError(f"cannot load {path}")
        self.tokenizer = FakeTokenizer()
        self.options = options
        self.last_token_ids = []
        print("fake driver loaded (this line must not reach stdout)")

    tokenizer_size = len(TOKENS)
    vocab_size = len(TOKENS) + PADDING_COLUMNS

    def memory_geometry(self):
        """What the entry's ``options: {memory: ...}`` says (a geometry as the real drivers report), else None."""
        return self.options.get("memory")

    def vocabulary(self):
        out = []
        for i in range(self.vocab_size):
            try:
                out.append(self.tokenizer.decode([i]) if i < len(TOKENS) else None)
            except ValueError:
                out.append(None)
        return out

    def stop_ids(self):
        return [END]

    def code_folder(self):
        return os.path.dirname(os.path.abspath(__file__))

    def prompt_text(self, image_path, question):
        return f"<img>{image_path}</img>\n{question}"

    def logits(self, image_path, question):
        if self.options.get("c_print"):  # what a C library's printf does: below Python's sys.stdout
            os.write(1, b"[C++ warning] cudnn not found\n")
        if self.options.get("stray_reply"):  # a line that looks like a protocol reply, on descriptor 1
            os.write(1, b'{"ok": true, "id": 1, "logits": [], "logsumexp": 0.0}\n')
        if "die" in question:
            os._exit(3)
        if "hang" in question:
            import time

            time.sleep(60)
        row = torch.full((self.vocab_size,), -5.0)
        row[-1] = 50.0  # a padding column: must never win or take mass
        row[4] = 1.0  # "ności" must not count as no
        row[9] = 1.0  # "Yesterday" must not count as yes
        if os.path.basename(image_path).startswith("end"):
            row[END] = 4.0
        elif "Which" in question:
            row[7] = 3.0
            row[5] = 1.0
        elif "yes" in os.path.basename(image_path):
            row[1] = 2.0
            row[0] = 1.0
        else:
            row[2] = 2.0
        if self.options.get("nan") and "nan" in os.path.basename(image_path):  # a float16 overflow
            row[2] = float("nan")
        return row

    def generate(self, image_path, question, max_new_tokens, num_beams=1, repetition_penalty=1.0, sampling=None):
        print("generating", file=sys.stderr)
        tag = "greedy" if num_beams == 1 else f"beam{num_beams}"
        if repetition_penalty != 1.0:
            tag += f"-rp{repetition_penalty:g}"
        # "end*" images, or any image with the option end_first under beam search (a beam that ends at once
        # although the first position's argmax is an answer word)
        if os.path.basename(image_path).startswith("end") or (self.options.get("end_first") and num_beams > 1):
            self.last_token_ids = [END]
            return "", tag
        answer = "C" if "Which" in question else ("Yes" if "yes" in os.path.basename(image_path) else "No")
        self.last_token_ids = [TOKENS.index(answer)]
        return f"{answer}{'.' if answer == 'C' else ','} I think", tag  # "C, ..." would not be a letter answer


def expected_p_yes(image_name):
    """P(yes) the fake's logits give: yes ids (0, 1) over yes + no ids (2, 3)."""
    e = math.exp
    if "yes" in image_name:
        yes, no = e(1.0) + e(2.0), e(-5.0) * 2
    else:
        yes, no = e(-5.0) * 2, e(2.0) + e(-5.0)
    return yes / (yes + no)
