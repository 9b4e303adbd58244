"""Bad input through the real entry point: one line naming the field, a non-zero exit, nothing written.

Errors found before the process group starts are checked at world size 1, through launch/train.py's main()
in one warm process (conftest.EntryServer); the rest run under torchrun with 2 ranks.
"""
import pytest

from conftest import rank_exit_codes, train_warm


@pytest.fixture
def python_train(entry):
    return lambda *args, tmp_path: entry.train(*args, f"output_dir={tmp_path}")


def error_line(proc) -> str:
    lines = [l for l in proc.stderr.splitlines() if l.startswith("rlcore: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("args, expected", [
    (["recipe=dmeo"], "unknown recipe 'dmeo'; did you mean 'demo'?"),
    (["recipe=demo", "optim.lrr=1"], "unknown config key 'optim.lrr'; did you mean 'optim.lr'?"),
    (["recipe=demo", "optim.lr=fast"], "config key 'optim.lr' expects float, got 'fast'"),
    (["recipe=demo", "train.steps=2.5"], "config key 'train.steps' expects int"),
    (["optim.lr=1"], "recipe=NAME is required"),
    (["recipe=demo", "rollout.tensor_parallel=0"], "rollout.tensor_parallel must be >= 1"),
    (["recipe=demo", "rollout.group_size=1"], "rollout.group_size must be >= 2 for GRPO (got 1)"),
    # the algorithm layer
    (["recipe=ppo_tiny", "algorithm.gamma=1.5"], "algorithm.gamma must be in [0, 1] (got 1.5)"),
    (["recipe=ppo_tiny", "algorithm.lam=-0.5"], "algorithm.lam must be in [0, 1] (got -0.5)"),
    (["recipe=ppo_tiny", "critic.path="], "PPO needs a critic but critic.path is empty: set critic.path=policy"),
    (["recipe=reinforce_pp_tiny", "algorithm.clip_low=-0.2"], "algorithm.clip_low must be >= 0 (got -0.2): a "
                                                              "negative value inverts the ratio range"),
    (["recipe=demo", "algorithm.loss_agg=mean"], "algorithm.loss_agg must be one of token-mean, "
     "seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (got 'mean')"),
    (["recipe=reinforce_pp_tiny", "algorithm.kl_penalty_estimator=k5"],
     "algorithm.kl_penalty_estimator must be one of k1, k2, k3 (got 'k5')"),
])
def test_config_errors(python_train, args, expected, tmp_path):
    proc = python_train(*args, tmp_path=tmp_path)
    assert proc.returncode == 2
    assert expected in error_line(proc)
    assert not any(tmp_path.iterdir()), "a rejected config must not create a run directory"


@pytest.mark.slow
def test_tp_must_divide_world(tmp_path):
    proc = train_warm("recipe=demo", "rollout.tensor_parallel=3", f"output_dir={tmp_path}")
    assert proc.returncode != 0
    assert "rollout.tensor_parallel=3 does not divide the world size 2; valid: [1, 2]" in error_line(proc)


def test_missing_model_path(python_train, tmp_path):
    proc = python_train("recipe=demo", "prepare=", f"model.path={tmp_path}/nope", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert f"model.path '{tmp_path}/nope' does not exist" in error_line(proc)


def test_model_that_is_not_a_causal_lm(python_train, tmp_path):
    from transformers import T5Config

    T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=32, vocab_size=32).save_pretrained(tmp_path / "t5")
    proc = python_train("recipe=demo", "prepare=", f"model.path={tmp_path}/t5", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "is a 't5' model, not a causal LM" in error_line(proc)


@pytest.mark.parametrize("kind, expected", [
    ("biogpt", "is a BioGptForCausalLM, which vLLM cannot serve (not in its model registry)"),
    ("quantized", "is a quantized Qwen2ForCausalLM (fp8): rlcore trains and syncs unquantized weights"),
    ("classifier", "is a Qwen2ForSequenceClassification, which transformers cannot build as a causal LM"),
])
def test_model_rlcore_cannot_train(python_train, kind, expected, tmp_path):
    """A transformers causal LM vLLM does not serve, a quantized checkpoint (the engine would expect quantized
    tensors, which the sync does not produce), and a qwen2-typed model that is not a causal LM: each stops
    before anything loads, naming model.path and the architecture."""
    from transformers import BioGptConfig, Qwen2Config

    tiny = dict(vocab_size=32, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    config = {"biogpt": BioGptConfig(**tiny, architectures=["BioGptForCausalLM"]),
              "quantized": Qwen2Config(**tiny, architectures=["Qwen2ForCausalLM"],
                                       quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"}),
              "classifier": Qwen2Config(**tiny, architectures=["Qwen2ForSequenceClassification"])}[kind]
    config.save_pretrained(tmp_path / kind)
    proc = python_train("recipe=demo", "prepare=", f"model.path={tmp_path / kind}", tmp_path=tmp_path / "runs")
    assert proc.returncode == 2
    assert f"model.path '{tmp_path / kind}' {expected}" in error_line(proc)
    assert not (tmp_path / "runs").exists()


def test_generation_longer_than_context(python_train, tmp_path):
    proc = python_train("recipe=demo", "rollout.max_new_tokens=100", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "does not fit the engine context" in error_line(proc)


def test_dataset_without_prompt_column(python_train, tmp_path):
    proc = python_train("recipe=demo", "data.prompt_column=question", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "data.prompt_column 'question' is not a column of data.path (columns: prompt, answer)" in error_line(proc)


BAD_REWARDS = '''
def raises(prompts, completions, **columns):
    for prompt in prompts:
        raise KeyError("boom")
    return []
'''


@pytest.mark.slow
def test_bad_reward_function_stops_before_the_update(tmp_path):
    """A reward function that raises stops every rank (exit 3) before any step is logged. A wrong-length list,
    a NaN or a non-number is the same RewardError on the same path; their one-line messages are unit-tested
    (tests/test_rewards.py::test_bad_reward_functions), so one real run stands for them."""
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    proc = train_warm("recipe=demo", f"rewards.0.fn={tmp_path}/bad_rewards.py:raises", f"output_dir={tmp_path}",
                     "data.eval_path=", "train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=2")
    assert proc.returncode != 0 and rank_exit_codes(proc) == {3}, proc.stderr[-3000:]
    assert "reward function 'raises' raised on sample 0 (prompt '" in error_line(proc)
    metrics = (tmp_path / "demo" / "metrics.jsonl").read_text()
    assert metrics == "", "no step may be logged (or applied) after a reward failure"


@pytest.mark.slow
def test_kill_9_of_torchrun_leaves_no_rank_training(tmp_path):
    """torchrun starts each rank in a session of its own, so `kill -9` of torchrun does not reach them: they used
    to train on alone and finish the run, writing checkpoints into the folder the resume of the killed job
    writes too (a resume raced them). launch/train.py asks the kernel to kill a rank when torchrun dies."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "launch" / "train.py"), "recipe=demo", "train.steps=60", "train.save_every=5", "data.eval_path=",
           f"output_dir={tmp_path}"]
    agent = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    metrics, deadline = tmp_path / "demo" / "metrics.jsonl", time.time() + 300
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.05)
    agent.send_signal(signal.SIGKILL)
    agent.wait()

    def ours() -> list[int]:  # the ranks: processes whose command line names this run's folder
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if str(tmp_path).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    pids.append(int(pid))
            except OSError:
                pass
        return pids

    killed = time.time()
    while ours() and time.time() < killed + 5:
        time.sleep(0.1)
    assert ours() == []  # gone within seconds (the run's 60 steps take longer than that)
    logged = metrics.read_text()
    time.sleep(2)
    assert metrics.read_text() == logged and len(logged.splitlines()) < 50  # nothing trains on
