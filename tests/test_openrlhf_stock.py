"""The plugin and the per-step reward hook inside stock OpenRLHF 0.11.2 (its own environment).

One process runs tests/openrlhf_checks.py: OpenRLHF's own ``_load_agent_executor`` builds our
``AgentExecutor`` from agent.py, the executor runs episodes against the stand-in engine and a
real (local) HTTP retrieval service, OpenRLHF's ``_process_response_into_experience`` turns them
into Experiences, and OpenRLHF's ``compute_advantages_and_returns`` computes returns with our
hook installed. Skipped when .venvs/openrlhf is absent (a failure with R3RAG_REQUIRE_ENVS=1).
"""

from __future__ import annotations

import pytest

from openrlhf_env import run_in_openrlhf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stock():
    return run_in_openrlhf("stock")


def test_hook_targets_exist_in_the_pinned_openrlhf(stock):
    """The three functions the hook wraps are there with the parameters it relies on; a renamed
    or re-signed one in a future OpenRLHF fails here (and install() refuses to run)."""
    assert stock["check_targets"] == []
    assert stock["installed_first"] is True and stock["installed_again"] is False


def test_openrlhf_loads_our_agent_executor(stock):
    assert stock["is_agent_executor"] is True


def test_experience_mask_and_step_rewards_equal_single_machine_trainer(stock):
    """OpenRLHF's action_mask built from our action ranges is the single-machine trainer's mask,
    and the hook's dense step rewards are the trainer's step_rewards (r3rag.train.rl.batch)."""
    assert stock["action_mask_equals_trainer"] is True
    assert stock["dense_equals_trainer"] is True
    assert stock["n_step_rewards"] >= 2


def test_gae_returns_follow_per_step_placement(stock):
    """OpenRLHF's own GAE (gamma=lambda=1, zero values) with the hook: the return of every action
    token is the sum of the step rewards from its step on: the trainer's placement, not stock's."""
    assert stock["gae_returns_equal_trainer_placement"] is True
    assert stock["gae_return_at_last_action"] == pytest.approx(2.0, abs=1e-5)
    assert stock["gae_return_at_first_action"] == pytest.approx(3.6, abs=1e-5)
    # stock OpenRLHF (no step rewards registered): the whole sum on the last token
    assert stock["stock_return_first_equals_last"] is True
    assert stock["stock_return_first"] == pytest.approx(3.6, abs=1e-5)
    assert stock["info_cleaned"] is True


def test_gae_at_the_shipped_lambda_skips_documents(stock):
    """OpenRLHF's own GAE at configs/rl/r3rag_ppo.yaml's gamma 1.0 / lambd 0.95, with the hook, on an
    episode whose steps are separated by retrieved documents: the single-machine trainer's returns."""
    assert stock["episode_has_documents_between_steps"] is True
    assert stock["gae_shipped_returns_equal_trainer"] is True


def test_dropped_sample_is_out_of_loss_and_baseline(stock):
    """reinforce_baseline: a dropped sample (retrieval outage) has no action tokens, and the group
    baseline is the mean of the kept samples only (stock OpenRLHF would average its 0 in)."""
    assert stock["dropped_has_no_actions"] == 0
    rewards = stock["rb_rewards"]
    for i, ret in enumerate(stock["rb_returns_first_action"]):
        if i == 2:
            assert ret is None
        else:
            assert ret == pytest.approx(rewards[i] - stock["group_mean_kept"], abs=1e-5)
    assert stock["group_mean_kept"] != pytest.approx(sum(rewards) / len(rewards))


def test_launcher_installs_the_hook_in_every_ray_worker(stock):
    """Ray runs the launcher's worker_process_setup_hook in a new worker process (where OpenRLHF's
    trainer actor lives) and passes our R3RAG_* variables next to OpenRLHF's own."""
    installed, agent_set, own, worker_pid, driver_pid = stock["ray_worker"]
    assert worker_pid != driver_pid
    assert installed is True and agent_set == "rollout.max_steps=4" and own == "1"
