"""A character tokenizer with a minimal chat template: `<role>` then the content and `|` (tests only)."""


class ToyTokenizer:
    eos_token_id = 0

    def encode(self, text):
        return [1 + (ord(c) % 250) for c in text]

    def chat_segments(self, messages):
        out = []
        for m in messages:
            out.append((f"<{m['role']}>", False))
            out.append((m["content"] + "|", m["role"] == "assistant"))
        return out
