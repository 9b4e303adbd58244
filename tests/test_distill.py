"""On-policy distillation (rlcore.algorithms.distill) against the hand-computed example of its docstring, the
estimator's expectation against the exact reverse KL, and the teacher checks through the warm entry server
(one line naming algorithm.teacher, exit 2, before any engine starts)."""
import json
import shutil

import pytest
import torch

from rlcore.algorithms.distill import Distill, distill_advantages
from rlcore.batch import Batch
from rlcore.config import Config, LoraConfig

OLD = torch.tensor([[-0.5, -2.0, -1.0]])
TEACHER = torch.tensor([[-0.3, -3.0, -1.0]])
MASK = torch.ones(1, 3)


def test_worked_example():
    """d = old - teacher = [-0.2, 1, 0]: pure distillation A = [0.2, -1, 0], sampled reverse KL mean(d) =
    0.266667; with a task advantage 0.5: kl_weight 1 -> [0.7, -0.5, 0.5], 0.5 -> [0.6, 0, 0.5]."""
    batch = Batch(input_ids=torch.zeros(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long),
                  loss_mask=MASK, rollout_logprobs=OLD, rewards=torch.ones(1), group_size=1, old_logprobs=OLD,
                  ref_logprobs=TEACHER)
    advantages, metrics = Distill(teacher="t").advantages(batch)
    torch.testing.assert_close(advantages, torch.tensor([[0.2, -1.0, 0.0]]))
    assert metrics == {"distill/reverse_kl": pytest.approx(0.266667, abs=1e-6)}
    task = torch.full((1, 1), 0.5)
    torch.testing.assert_close(distill_advantages(OLD, TEACHER, MASK, 1.0, task, 1.0), torch.tensor([[0.7, -0.5, 0.5]]))
    torch.testing.assert_close(distill_advantages(OLD, TEACHER, MASK, 0.5, task, 1.0), torch.tensor([[0.6, 0.0, 0.5]]))
    # a padded position stays 0
    torch.testing.assert_close(distill_advantages(OLD, TEACHER, torch.tensor([[1.0, 1, 0]]), 1.0),
                               torch.tensor([[0.2, -1.0, 0.0]]))


def test_the_sampled_signal_is_the_reverse_kl_in_expectation():
    """Over a 3-token vocabulary, student p = [0.5, 0.3, 0.2], teacher q = [0.4, 0.4, 0.2]: E_p[d] = KL(p||q) =
    0.025267 (the forward KL(q||p) is 0.025815), and the policy gradient with advantage -d, in expectation over
    the sampled token, is the exact gradient of KL(p||q) in the logits: p_k (log(p_k/q_k) - KL) =
    [0.098938, -0.093885, -0.005053]."""
    p, q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    d = p.log() - q.log()
    assert (p * d).sum().item() == pytest.approx(0.025267, abs=1e-6)
    assert (q * (q.log() - p.log())).sum().item() == pytest.approx(0.025815, abs=1e-6)
    logits = p.log().clone().requires_grad_()
    exact = torch.autograd.grad(torch.sum(logits.softmax(-1) * (logits.log_softmax(-1) - q.log())), logits)[0]
    # REINFORCE: sum_y p_y * A_y * grad log p_y, with A_y = -d_y, is the gradient of -KL: minus it descends KL
    logp = logits.log_softmax(-1)
    surrogate = -sum(p[y] * (-d[y]) * logp[y] for y in range(3))
    estimated = torch.autograd.grad(surrogate, logits)[0]
    torch.testing.assert_close(exact, torch.tensor([0.098938, -0.093885, -0.005053], dtype=torch.float64), atol=1e-6,
                               rtol=0)
    torch.testing.assert_close(estimated, exact)


@pytest.mark.parametrize("fields, cfg, says", [
    ({}, Config(), "algorithm.teacher is empty: on-policy distillation needs a teacher model folder"),
    ({"teacher": "t", "kl_weight": 0.0}, Config(), "algorithm.kl_weight must be > 0 (got 0.0)"),
    ({"teacher": "t", "task_weight": -1.0}, Config(), "algorithm.task_weight must be >= 0 (got -1.0)"),
    ({"teacher": "t"}, Config(lora=LoraConfig(enabled=True)), "algorithm.teacher with lora.enabled=true is not "
                                                               "supported"),
])
def test_refusals(fields, cfg, says):
    with pytest.raises(ValueError) as e:
        Distill(**fields).validate(cfg)
    assert str(e.value).startswith(says)


def _teacher(tmp_path, how):
    from rlcore.tasks import tiny

    tiny.prepare_teacher()
    path = tmp_path / "teacher"
    shutil.copytree(tiny.teacher_dir(), path)
    if how == "vocab":
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(config | {"vocab_size": 40}))
    elif how == "tokenizer":  # the same size, two ids swapped: "0" <-> "1"
        tok = json.loads((path / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        vocab["0"], vocab["1"] = vocab["1"], vocab["0"]
        (path / "tokenizer.json").write_text(json.dumps(tok))
    elif how == "missing":
        shutil.rmtree(path)
    return path


@pytest.mark.parametrize("how, says", [
    ("vocab", "has another vocab_size than model.path (40 vs the student's 32): on-policy distillation compares "
              "both models' logprobs of the same token ids, so the teacher must share the student's tokenizer"),
    ("tokenizer", "has another tokenizer than model.path (another token -> id map)"),
    ("missing", "algorithm.teacher '{path}'"),
])
def test_teacher_refused_before_any_engine(entry, tmp_path, how, says):
    path = _teacher(tmp_path, how)
    proc = entry.train("recipe=distill_tiny", f"algorithm.teacher={path}", f"output_dir={tmp_path}/runs")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlcore: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert says.format(path=path) in lines[0] and lines[0].startswith(f"rlcore: error: algorithm.teacher '{path}'")
    assert not (tmp_path / "runs").exists()
