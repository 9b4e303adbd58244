"""Chat observations as token ids: what to append after a model turn so the transcript reads as chat turns.

A multi-turn rollout never re-renders or re-encodes the model's own tokens (that drifts: templates strip
earlier reasoning, BPE merges differently). Each observation is the suffix the trained model's chat template
renders for it, found by diffing two renders of a dummy conversation, and appended once. For a ChatML
template (Qwen2.5), a tool answer "42" after the model's turn lays out as

    prompt      <|im_start|>user\\n12*4-6?<|im_end|>\\n<|im_start|>assistant\\n
    sampled     <tool_call>12*4-6</tool_call><|im_end|>                    (the model stops at <|im_end|>)
    observation \\n<|im_start|>user\\n<tool_response>\\n42\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n
    sampled     The answer is 42.<|im_end|>

The "\\n" after the model's <|im_end|> is rendered by the template, not sampled, so it opens the observation.
The concatenation equals the template's render of the whole conversation token for token only when the
template is prefix-preserving; `check_prefix_preserving` tests that once at startup.
"""
from __future__ import annotations

import functools

from jinja2 import TemplateError

_DUMMY = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in transformers 5


def _turn_end(tokenizer, ids: list[int], start: int) -> int:
    """Index just past the last special token at or after `start`: the end-of-turn token the model samples."""
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    for i in range(len(ids) - 1, start - 1, -1):
        if ids[i] in special:
            return i + 1
    raise ValueError("the chat template ends an assistant turn without a special end-of-turn token, so a "
                     "model turn has no token to stop at")


def _assistant_end(tokenizer, messages: list[dict]) -> tuple[list[int], int]:
    """The render of `messages` (ending with an assistant turn) and where that turn's end-of-turn token ends."""
    ids = _render(tokenizer, messages, generation_prompt=False)
    return ids, _turn_end(tokenizer, ids, len(_render(tokenizer, messages[:-1], generation_prompt=True)))


@functools.lru_cache(maxsize=8)
def _dummy_end(tokenizer, template: str | None) -> tuple[tuple[int, ...], int]:
    """_assistant_end of the dummy conversation, once per tokenizer and template (two renders every observation
    would otherwise repeat)."""
    ids, end = _assistant_end(tokenizer, _DUMMY)
    return tuple(ids), end


def end_of_turn_id(tokenizer) -> int:
    """The token that ends an assistant turn in the chat template (<|im_end|> for ChatML): a turn's stop token."""
    ids, end = _dummy_end(tokenizer, tokenizer.chat_template)
    return ids[end - 1]


def renders_tool_call_ids(tokenizer) -> bool:
    """Whether the chat template writes a tool message's tool_call_id (ChatML's does not): when it does not, tool
    answers that differ only in their ids render to the same tokens. A template that cannot say: True."""
    def render(call_id: str) -> list[int]:
        return _render(tokenizer, _DUMMY + [{"role": "tool", "tool_call_id": call_id, "content": "1"}], True)
    try:
        return render("call_0") != render("call_1")
    except (TemplateError, KeyError, TypeError, ValueError):
        return True


def observation_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids to append after a model turn that ended with the end-of-turn token, so that `messages`
    (e.g. [{"role": "tool", "content": "42"}]) render as chat turns followed by the assistant's generation
    prompt. Only the new suffix is rendered, against a dummy conversation; the model's tokens are untouched."""
    before, end = _dummy_end(tokenizer, tokenizer.chat_template)
    after = _render(tokenizer, _DUMMY + list(messages), generation_prompt=True)
    if tuple(after[:end]) != before[:end]:
        raise ValueError("the chat template re-renders earlier turns when messages are appended; "
                         "see rlcore.rollout.chat.check_prefix_preserving")
    return after[end:]


def check_prefix_preserving(tokenizer, field: str = "data.chat_template",
                            roles: tuple[str, ...] = ("tool", "assistant")) -> None:
    """Raise a one-line ValueError unless appending turns with `roles` after [user, assistant] leaves the
    rendering of every earlier turn unchanged (the model's tokens up to its end-of-turn token included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{field} is on but the tokenizer has no chat template; set one (tokenizer.chat_template "
                         f"or chat_template.jinja in the model folder) or turn {field} off")
    # Earlier reasoning in the first answer: templates that strip it from past turns fail here.
    conv = [{"role": "user", "content": "Question one?"},
            {"role": "assistant", "content": "<think>Thought one.</think>Answer one."}]
    conv += [{"role": role, "content": f"{role.capitalize()} turn {n}."} for n, role in enumerate(roles, 2)]
    # Checkpoints: the render before each assistant turn (the model's prompt) and after it, up to its
    # end-of-turn token (what the model sampled); consecutive other messages arrive as one observation.
    prev, start = [], 0
    for k in range(1, len(conv) + 1):
        last = conv[k - 1]["role"] == "assistant"
        if not last and k < len(conv) and conv[k]["role"] != "assistant":
            continue
        new = conv[start:k]
        where = f"appending {[m['role'] for m in new]} after {[m['role'] for m in conv[:start]]}"
        odd = {m["role"] for m in new} - {"user", "assistant"}
        hint = f"; use role 'user' for observations instead of {sorted(odd)}" if odd else ""
        try:
            if last:
                cur, keep = _assistant_end(tokenizer, conv[:k])
            else:
                cur = _render(tokenizer, conv[:k], generation_prompt=True)
                keep = len(cur)
        except TemplateError as e:
            raise ValueError(f"{field}: the chat template fails when {where} ({' '.join(str(e).split())})"
                             f"{hint}") from None
        text = tokenizer.decode(cur)
        if any(m["content"].split("</think>")[-1] not in text for m in new):
            raise ValueError(f"{field}: the chat template drops the content of a turn when {where}{hint}")
        # What the model was already fed or sampled must stay a prefix of the longer render.
        if cur[:len(prev)] != prev:
            i = next((j for j, (a, b) in enumerate(zip(prev, cur)) if a != b), min(len(prev), len(cur)))
            raise ValueError(f"{field}: the chat template is not prefix-preserving: {where} changes the earlier "
                             f"render at token {i}: {tokenizer.decode(prev[i:i + 16])!r} became "
                             f"{tokenizer.decode(cur[i:i + 16])!r}; multi-turn rollouts append tokens and never "
                             f"re-render, so use a template that renders past turns as it did when they were last")
        prev, start = cur[:keep], k
