"""Chat observations as token ids (rlcore.rollout.chat), on character-level tokenizers built here with small
templates: prompt + sampled + observation ids equal the template's full render token for token; the
prefix-preserving check passes good templates and names the problem in bad ones."""
import string

import pytest

from rlcore.rollout.chat import check_prefix_preserving, end_of_turn_id, observation_ids

# Qwen2.5 style: consecutive tool messages share one user turn of <tool_response> blocks.
CHATML = (
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Llama 3 style: nothing after the end-of-turn token.
HEADERS = ("{%- for m in messages %}<|start|>{{ m.role }}<|end|>\n\n{{ m.content }}<|eot|>{% endfor %}"
           "{%- if add_generation_prompt %}<|start|>assistant<|end|>\n\n{% endif %}")
# Qwen3 style, simplified: the reasoning of assistant turns that are not last is dropped.
STRIPS_THINKING = CHATML.replace("+ m.content + '<|im_end|>",
                                 "+ (m.content if loop.last else m.content.split('</think>')[-1]) + '<|im_end|>")
# A last message rendered differently from an earlier one.
MARKS_LAST = CHATML.replace("+ m.content + '<|im_end|>",
                            "+ m.content + (' (last)' if loop.last else '') + '<|im_end|>")
# No tool role at all.
NO_TOOL = ("{%- for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
           "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}"
           "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|start|>", "<|end|>", "<|eot|>"]


def tokenizer(template: str | None):
    """One token per character of string.printable, plus the special tokens above."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(string.printable)))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                  extra_special_tokens=SPECIALS[2:])
    tok.chat_template = template
    return tok


def render(tok, messages, generation_prompt):
    ids = tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_observation_layout_chatml():
    tok = tokenizer(CHATML)
    assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<|im_end|>")
    obs = observation_ids(tok, [{"role": "tool", "content": "42"}])
    # The "\n" after the model's <|im_end|> is the template's, so the observation starts with it.
    assert obs == encode(tok, "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                              "<|im_start|>assistant\n")


@pytest.mark.parametrize("template, eot", [(CHATML, "<|im_end|>"), (HEADERS, "<|eot|>")])
def test_appended_ids_equal_full_render(template, eot):
    """prompt + sampled (ending with the end-of-turn token) + observation, over three model turns and
    observations of one tool, two tools and a user message, equals the whole conversation's render."""
    tok = tokenizer(template)
    eot_id = tok.convert_tokens_to_ids(eot)
    assert end_of_turn_id(tok) == eot_id
    conv = [{"role": "user", "content": "What is 12*4-6?"}]
    ids = render(tok, conv, generation_prompt=True)
    turns = [("<tool_call>12*4</tool_call>", [{"role": "tool", "content": "48"}]),
             ("<tool_call>48-6</tool_call><tool_call>6*7</tool_call>",
              [{"role": "tool", "content": "42"}, {"role": "tool", "content": "42"}]),
             ("Both are 42.", [{"role": "user", "content": "Sure?"}])]
    for answer, messages in turns:
        ids += encode(tok, answer) + [eot_id]  # what the model samples: it stops at the end-of-turn token
        ids += observation_ids(tok, messages)
        conv += [{"role": "assistant", "content": answer}, *messages]
        assert ids == render(tok, conv, generation_prompt=True)


@pytest.mark.parametrize("template", [CHATML, HEADERS])
def test_check_passes_prefix_preserving_templates(template):
    check_prefix_preserving(tokenizer(template))
    check_prefix_preserving(tokenizer(template), roles=("user", "assistant", "tool", "tool", "assistant"))


@pytest.mark.parametrize("template, match", [
    (STRIPS_THINKING, r"appending \['tool'\] after \['user', 'assistant'\] changes the earlier render at "
                      r"token 32: '<think>Thought o' became 'Answer one.<\|im_end\|>\\n<\|im_start\|>us'; "),
    (MARKS_LAST, r"appending \['assistant'\] after \['user'\] changes the earlier render at token 19: "
                 r"' \(last\)<\|im_end\|>\\n<\|im_start\|>assist' became "
                 r"'<\|im_end\|>\\n<\|im_start\|>assistant\\n<th'; "),
])
def test_check_names_the_change(template, match):
    with pytest.raises(ValueError, match="data.chat_template: the chat template is not prefix-preserving: "
                                         + match) as err:
        check_prefix_preserving(tokenizer(template))
    assert "\n" not in str(err.value)
    if template is MARKS_LAST:  # the dummy conversation already shows it
        with pytest.raises(ValueError, match="re-renders earlier turns"):
            observation_ids(tokenizer(template), [{"role": "user", "content": "ok"}])


def test_check_tool_role_missing_template_and_dropped_tool():
    with pytest.raises(ValueError, match=r"fails when appending \['tool'\] after \['user', 'assistant'\] "
                                         r"\(Unknown role: tool\); "
                                         r"use role 'user' for observations instead of \['tool'\]$"):
        check_prefix_preserving(tokenizer(NO_TOOL))
    check_prefix_preserving(tokenizer(NO_TOOL), roles=("user", "assistant"))
    with pytest.raises(ValueError, match=r"^rollout.env: the chat template drops the content of a turn when "
                                         r"appending \['tool'\] after \['user', 'assistant'\]; use role 'user'"):
        check_prefix_preserving(tokenizer(NO_TOOL.replace("{{ raise_exception('Unknown role: ' + m.role) }}", "")
                                          .replace("{{ m.content }}", "{{ m.content if m.role != 'tool' }}")),
                                field="rollout.env")
    with pytest.raises(ValueError, match="^data.chat_template is on but the tokenizer has no chat template"):
        check_prefix_preserving(tokenizer(None))


def test_a_multi_turn_run_refuses_a_template_that_is_not_prefix_preserving():
    """The startup check of the environment settings (rlcore.rollout.envs.make_envs, run before any engine
    starts) applies the prefix check when the data uses the chat template; a good template passes."""
    from rlcore.config import Config, DataConfig, RolloutConfig
    from rlcore.rollout.envs import make_envs

    class Tool:
        max_turns = 2

        def __init__(self, row):
            pass

        def step(self, action, action_ids):
            return [{"role": "tool", "content": "42"}], 0.0, False

    cfg = Config(data=DataConfig(chat_template=True),
                 rollout=RolloutConfig(env=Tool, max_new_tokens=8, max_total_tokens=64))
    envs = make_envs(cfg, tokenizer(CHATML), {"prompt": "2*21?"}, vocab_size=128)
    assert envs.max_turns == 2 and envs.encode([{"role": "tool", "content": "42"}]) == \
        encode(tokenizer(CHATML), "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                                  "<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"^data.chat_template: the chat template is not prefix-preserving") as e:
        make_envs(cfg, tokenizer(STRIPS_THINKING), {"prompt": "2*21?"}, vocab_size=128)
    assert "\n" not in str(e.value)
