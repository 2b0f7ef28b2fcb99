"""Reinforcement learning on one machine (CPU or one GPU) over the rollout engine and reward recipes.

- :mod:`.config`      the ``configs/rl/*.yaml`` schema (stages for two-stage schedules)
- :mod:`.batch`       trajectories -> padded tensors, masks, per-step rewards on the right tokens
- :mod:`.estimators`  advantage estimators by name (OpenRLHF's names and numbers)
- :mod:`.losses`      clipped policy loss, KL k1/k2/k3, value loss, entropy
- :mod:`.forward`     log-probs of generated tokens only; :mod:`.value_head` the critic
- :mod:`.loop`        the iteration, resume, evaluation, schedules; :mod:`.checkpoint`,
  :mod:`.metrics`, :mod:`.plots`, :mod:`.evaluate`
"""
