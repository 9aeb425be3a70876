"""sluice.control.policy.evaluate_on_exit applies a retry strategy the way AWS Batch does."""

from __future__ import annotations

from sluice.control.policy import EVALUATE_ON_EXIT, HOST_LOST_REASON, evaluate_on_exit, is_host_lost, retry_strategy

HOST_LOST = HOST_LOST_REASON.format(instance="i-0abc")
EXITED = "Essential container in task exited"


def test_sluice_rule_retries_a_lost_host_and_exits_on_anything_else() -> None:
    assert evaluate_on_exit(EVALUATE_ON_EXIT, status_reason=HOST_LOST, reason=None, exit_code=None) == "RETRY"
    assert evaluate_on_exit(EVALUATE_ON_EXIT, status_reason=EXITED, reason=None, exit_code=1) == "EXIT"
    assert evaluate_on_exit(EVALUATE_ON_EXIT, status_reason=EXITED, reason="OutOfMemoryError", exit_code=137) == "EXIT"
    assert is_host_lost(HOST_LOST) and not is_host_lost(EXITED) and not is_host_lost(None)


def test_first_matching_rule_wins() -> None:
    rules = [
        {"onExitCode": "3", "action": "EXIT"},
        {"onExitCode": "*", "action": "RETRY"},
    ]
    assert evaluate_on_exit(rules, status_reason=EXITED, reason=None, exit_code=3) == "EXIT"
    assert evaluate_on_exit(rules, status_reason=EXITED, reason=None, exit_code=4) == "RETRY"
    assert evaluate_on_exit(list(reversed(rules)), status_reason=EXITED, reason=None, exit_code=3) == "RETRY"


def test_no_matching_rule_retries() -> None:
    rules = [{"onStatusReason": "Host EC2*", "action": "EXIT"}]
    assert evaluate_on_exit(rules, status_reason=EXITED, reason=None, exit_code=1) == "RETRY"
    assert evaluate_on_exit([], status_reason=EXITED, reason=None, exit_code=1) == "RETRY"


def test_trailing_star_is_a_prefix_glob() -> None:
    rules = [{"onStatusReason": "Host EC2*", "action": "RETRY"}, {"onReason": "*", "action": "EXIT"}]
    assert evaluate_on_exit(rules, status_reason="Host EC2", reason=None, exit_code=None) == "RETRY"
    assert evaluate_on_exit(rules, status_reason=HOST_LOST, reason=None, exit_code=None) == "RETRY"
    # The prefix must match from the start, and case matters.
    assert evaluate_on_exit(rules, status_reason="The Host EC2 went away", reason=None, exit_code=None) == "EXIT"
    assert evaluate_on_exit(rules, status_reason="host ec2 (instance i-1)", reason=None, exit_code=None) == "EXIT"


def test_without_a_star_the_match_is_exact() -> None:
    rules = [{"onReason": "CannotPullContainerError", "action": "RETRY"}, {"onReason": "*", "action": "EXIT"}]
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="CannotPullContainerError", exit_code=None) == "RETRY"
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="CannotPullContainerError: x", exit_code=None) == "EXIT"
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="CannotPull", exit_code=None) == "EXIT"


def test_every_condition_of_a_rule_must_match() -> None:
    rules = [{"onExitCode": "1", "onReason": "Boom*", "action": "EXIT"}]
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="Boom!", exit_code=1) == "EXIT"
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="Boom!", exit_code=2) == "RETRY"
    assert evaluate_on_exit(rules, status_reason=EXITED, reason="Fine", exit_code=1) == "RETRY"


def test_a_missing_exit_code_matches_only_star() -> None:
    rules = [{"onExitCode": "0*", "action": "EXIT"}, {"onExitCode": "*", "action": "RETRY"}]
    assert evaluate_on_exit(rules, status_reason=HOST_LOST, reason=None, exit_code=None) == "RETRY"
    only_codes = [{"onExitCode": "1", "action": "EXIT"}]
    assert evaluate_on_exit(only_codes, status_reason=HOST_LOST, reason=None, exit_code=None) == "RETRY"
    assert evaluate_on_exit(only_codes, status_reason=EXITED, reason=None, exit_code=1) == "EXIT"


def test_action_is_case_insensitive() -> None:
    # DescribeJobDefinitions (moto) returns the actions lower-cased.
    lower = [{"onStatusReason": "Host EC2*", "action": "retry"}, {"onReason": "*", "action": "exit"}]
    assert evaluate_on_exit(lower, status_reason=HOST_LOST, reason=None, exit_code=None) == "RETRY"
    assert evaluate_on_exit(lower, status_reason=EXITED, reason=None, exit_code=1) == "EXIT"
    mixed = [{"onReason": "*", "action": "Retry"}]
    assert evaluate_on_exit(mixed, status_reason=EXITED, reason=None, exit_code=1) == "RETRY"


def test_retry_strategy_carries_the_rule_and_attempts() -> None:
    strategy = retry_strategy(5)
    assert strategy["attempts"] == 5
    assert strategy["evaluateOnExit"] == [dict(r) for r in EVALUATE_ON_EXIT]
    assert len(strategy["evaluateOnExit"]) == 3  # lost host, stall (exit 75), then exit on anything else
    strategy["evaluateOnExit"][0]["action"] = "EXIT"  # a copy: the shared rule is unchanged
    assert EVALUATE_ON_EXIT[0]["action"] == "RETRY"


def test_a_stalled_attempt_is_retried_and_a_plain_failure_is_not() -> None:
    from sluice.control.policy import STALLED_EXIT

    assert evaluate_on_exit(EVALUATE_ON_EXIT, status_reason=EXITED, reason=None, exit_code=STALLED_EXIT) == "RETRY"
    assert evaluate_on_exit(EVALUATE_ON_EXIT, status_reason=EXITED, reason=None, exit_code=STALLED_EXIT + 1) == "EXIT"


def test_the_index_mode_is_decided_by_the_rows_within_batchs_array_limits():
    from sluice.control.policy import index_mode

    assert index_mode(1_999_999, 2_000_000, 10_000_000) == ("single", 1)
    assert index_mode(2_000_000, 2_000_000, 10_000_000) == ("fleet", 2)  # at least 2: Batch's array minimum
    assert index_mode(300_000_000, 2_000_000, 10_000_000) == ("fleet", 30)  # ceil(rows / rows a child)
    assert index_mode(300_000_001, 2_000_000, 10_000_000) == ("fleet", 31)
    assert index_mode(10**12, 2_000_000, 10_000_000) == ("fleet", 10_000)  # Batch's array maximum


def test_the_fleet_threshold_defaults_to_where_the_plans_estimates_cross(monkeypatch):
    from sluice.control.policy import INDEX_STAGES, index_mode, index_stage_s
    from sluice.settings import Settings

    monkeypatch.delenv("SLUICE_INDEX_FLEET_ROWS", raising=False)
    default = Settings().index_fleet_rows

    def single_and_fleet_s(rows: int) -> tuple[float, float]:
        _, children = index_mode(rows, 1, Settings().index_rows_per_child)  # the children the stages would get
        return index_stage_s("single", rows, 1), sum(index_stage_s(st, rows, children) for st in INDEX_STAGES)

    single, fleet = single_and_fleet_s(default * 3 // 4)
    assert single < fleet  # below the default one job is estimated faster ...
    single, fleet = single_and_fleet_s(default)
    assert fleet < single < fleet * 1.25  # ... at it the stages are, by a margin their extra job start-ups may eat


def test_fleet_stage_timeouts_follow_their_own_rows():
    from sluice.control.policy import INDEX_BASE_S, INDEX_MIN_S, index_stage_s, index_stage_timeout_s

    rows, children = 300_000_000, 30
    # A child's time is its share of the rows; train's grows with every row (the merge); commit's does not.
    assert index_stage_s("segments", rows, children) == index_stage_s("segments", rows // children, 1)
    assert index_stage_s("train", 2 * rows, children) > 1.9 * index_stage_s("train", rows, children)
    assert index_stage_s("commit", rows, children) == index_stage_s("commit", 1, 2)
    for stage in ("train", "segments", "commit"):
        t = index_stage_timeout_s(stage, rows, children)
        assert t >= INDEX_MIN_S and t >= INDEX_BASE_S + 4 * index_stage_s(stage, rows, children) - 1


def test_segment_children_retry_any_failure_train_and_commit_a_lost_host_only():
    from sluice.control.policy import evaluate_on_exit, index_child_retry_strategy, index_retry_strategy

    child, once = index_child_retry_strategy(), index_retry_strategy(2)
    assert child["attempts"] == 3 and once["attempts"] == 2
    failed = {"status_reason": "Essential container in task exited", "reason": None, "exit_code": 1}
    assert evaluate_on_exit(child["evaluateOnExit"], **failed) == "RETRY"
    assert evaluate_on_exit(once["evaluateOnExit"], **failed) == "EXIT"
    lost = {"status_reason": "Host EC2 (instance i-1) terminated.", "reason": None, "exit_code": None}
    assert (
        evaluate_on_exit(child["evaluateOnExit"], **lost) == evaluate_on_exit(once["evaluateOnExit"], **lost) == "RETRY"
    )


def test_index_job_names_carry_the_rerun_and_the_stage_and_parse_back():
    from sluice.control.indexing.jobs import is_index_job, job_name, parse_name

    run = "a-index-b"  # a run id that itself holds "-index"
    assert (
        job_name(run) == "sluice-a-index-b-index"
        and job_name(run, 2, "segments") == "sluice-a-index-b-index-r2-segments"
    )
    for rerun in (0, 1, 12):
        for stage in (None, "train", "segments", "commit"):
            assert parse_name(run, job_name(run, rerun, stage)) == (rerun, stage)
    assert not is_index_job(run, job_name(run) + "-x") and not is_index_job("other", job_name(run))
    long = "r" * 200  # names are cut to Batch's 128 characters, the suffix kept
    assert len(job_name(long, 3, "commit")) == 128 and parse_name(long, job_name(long, 3, "commit")) == (3, "commit")
