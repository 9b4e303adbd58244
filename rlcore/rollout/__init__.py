"""The rollout stage: a step's prompt rows in, one rank's training `Batch` out, through the vLLM engine
(rlcore/engine/).

    collect.py  sampling through the engine, dynamic sampling's extra draws, rewards, greedy eval
    turns.py    the lockstep turn loop; continuous.py the per-trajectory schedule; env.py the protocol users implement
    agents.py   rollout.agent: a user's openai-client agent per trajectory, through endpoint.py (an
                OpenAI-compatible server over the engine) and sessions.py (each call's token ids recorded)
    standards.py  environments of a standard (TRL's environment_factory) on the native tool path (tools.py)
"""
