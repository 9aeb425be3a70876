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
