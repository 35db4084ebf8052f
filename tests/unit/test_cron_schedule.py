"""Cron definitions, expressions, time zones, DST and catch-up (ojs-cron.md §2–5, §7.3): the spec's rules as vectors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ojs_kombu.errors import ValidationError
from ojs_kombu.model.cron import MACROS, CronExpression, CronJob, enqueue_limit_key, parse_timezone
from ojs_kombu.policy.cron import dst_skipped, due, evaluation_delay, next_fire

NY = parse_timezone("America/New_York")
LONDON = parse_timezone("Europe/London")


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def fires(expression: str, zone, after: datetime, count: int) -> list[datetime]:
    parsed, out = CronExpression.parse(expression), []
    for _ in range(count):
        after = next_fire(parsed, zone, after)
        assert after is not None
        out.append(after)
    return out


def local(values: list[datetime], zone) -> list[str]:
    return [v.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S%z") for v in values]


# --- the definition (spec §2) -------------------------------------------------------------------


def test_spec_example_definition_round_trips():
    data = {
        "name": "daily-report",
        "cron": "0 9 * * *",
        "timezone": "America/New_York",
        "type": "report.generate",
        "args": [{"report": "daily_summary"}],
        "options": {
            "queue": "reports",
            "timeout": 300,
            "retry": {"max_attempts": 3, "initial_interval": "PT30S", "backoff_coefficient": 2.0},
        },
        "overlap_policy": "skip",
        "enabled": True,
        "description": "Generate daily summary report at 9 AM ET",
    }
    job = CronJob.from_dict(data)
    assert job.to_dict() == data
    assert job.queue == "reports"


def test_defaults_are_the_specs():
    job = CronJob(name="hourly-cleanup", cron="@hourly", type="maintenance.cleanup")
    assert (job.timezone, job.overlap_policy, job.enabled, job.args, job.options, job.description) == (
        "UTC",  # CRON-15
        "skip",  # CRON-19
        True,
        [],
        {},
        None,
    )
    assert job.queue == "default"


def test_system_managed_fields_are_ignored():  # CRON-06
    job = CronJob.from_dict(
        {"name": "a", "cron": "@daily", "type": "a.b", "run_count": 42, "next_run_at": "x", "last_run_at": None}
    )
    assert "run_count" not in job.to_dict()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Daily"}, "name"),  # CRON-02: lowercase only
        ({"name": "-daily"}, "name"),
        ({"name": "a" * 256}, "name"),
        ({"name": 7}, "name"),
        ({"cron": "61 * * * *"}, "cron"),  # CRON-11
        ({"type": "Report"}, "type"),  # CRON-04
        ({"args": {"a": 1}}, "args"),  # CRON-05
        ({"args": [b"bytes"]}, "args[0]"),
        ({"timezone": "EST"}, "timezone"),  # CRON-14
        ({"overlap_policy": "replace"}, "overlap_policy"),
        ({"enabled": "yes"}, "enabled"),
        ({"description": 5}, "description"),
        ({"options": []}, "options"),
        ({"options": {"queue": "Bad Queue"}}, "options.queue"),
        ({"options": {"timeout": 0}}, "options.timeout"),
        ({"options": {"tags": "x"}}, "options.tags"),
        ({"options": {"meta": 1}}, "options.meta"),
        ({"options": {"retry": {"max_attempts": -1}}}, "options.retry.max_attempts"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_fields_are_named(change, field):
    data = {"name": "daily-report", "cron": "0 9 * * *", "type": "report.generate", **change}
    with pytest.raises(ValidationError) as raised:
        CronJob.from_dict(data)
    assert raised.value.field == field


@pytest.mark.parametrize("missing", ["name", "cron", "type"])
def test_required_fields(missing):
    data = {"name": "a", "cron": "@daily", "type": "a.b"}
    del data[missing]
    with pytest.raises(ValidationError) as raised:
        CronJob.from_dict(data)
    assert raised.value.field == missing


@pytest.mark.parametrize("policy", ["skip", "allow", "cancel_previous", "enqueue"])
def test_all_four_overlap_policies(policy):  # CRON-18
    assert CronJob(name="a", cron="@daily", type="a.b", overlap_policy=policy).overlap_policy == policy


def test_enqueue_occurrences_carry_a_concurrency_of_one_keyed_by_the_name():  # CRON-18
    """Only ``enqueue`` gets a limit of its own; a template's ``rate_limit`` wins when it keeps them one at a time."""
    limit = CronJob(name="serial", cron="@daily", type="a.b", overlap_policy="enqueue").rate_limit
    assert limit is not None and (limit.key, limit.concurrency, limit.action) == ("cron:serial", 1, "wait")
    assert all(
        CronJob(name="a", cron="@daily", type="a.b", overlap_policy=p).rate_limit is None for p in ("skip", "allow")
    )
    long_a, long_b = "a" * 254 + "b", "a" * 254 + "c"
    assert len(enqueue_limit_key(long_a)) == 160 and enqueue_limit_key(long_a) != enqueue_limit_key(long_b)
    own = {"key": "migrations", "concurrency": 1, "on_limit": "reschedule"}
    job = CronJob(name="m", cron="@daily", type="a.b", options={"rate_limit": own}, overlap_policy="enqueue")
    assert job.rate_limit is not None and job.rate_limit.key == "migrations"
    shared = {"key": "api", "concurrency": 3}
    assert CronJob(name="a", cron="@daily", type="a.b", options={"rate_limit": shared}).rate_limit.concurrency == 3
    for bad, field in (
        (shared, "options.rate_limit"),
        ({"key": "api", "concurrency": 1, "on_limit": "drop"}, "options.rate_limit"),
        ({"key": "no spaces"}, "options.rate_limit.key"),
    ):
        with pytest.raises(ValidationError) as raised:
            CronJob(name="a", cron="@daily", type="a.b", options={"rate_limit": bad}, overlap_policy="enqueue")
        assert raised.value.field == field


# --- expressions (spec §3, §4) --------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "60 * * * *",  # out of range
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",  # never a valid day
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",  # step 0
        "5-1 * * * *",  # reversed range
        "1- * * * *",
        "1,,2 * * * *",
        "* * * *",  # 4 fields
        "* * * * * * *",  # 7 fields
        "60 * * * * *",  # 6 fields: seconds out of range
        "0 0 30 2 *",  # a day February never has
        "@fortnightly",
        "@daily extra",
        "@every",
        "@every 0s",
        "@every 5 m",
        "@every 5x",
        "@every -5m",
        7,
    ],
)
def test_invalid_expressions_are_refused(expression):  # CRON-11, spec §3.5
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse(expression)
    assert raised.value.field == "cron"


def test_the_error_names_the_cron_field_that_is_wrong():
    with pytest.raises(ValidationError, match="day-of-month field '32'"):
        CronExpression.parse("0 0 32 * *")
    with pytest.raises(ValidationError, match="second field '61'"):
        CronExpression.parse("61 0 0 * * *")


def test_a_day_some_months_lack_is_accepted_with_a_warning():  # spec §3.5
    expression = CronExpression.parse("0 0 31 * *")
    assert expression.warnings
    assert not CronExpression.parse("0 0 1 * *").warnings
    assert not CronExpression.parse("0 0 1-31 * *").warnings  # every day: nothing to warn about
    assert CronExpression.parse("0 0 1,30 * *").warnings
    # It does not fire in months without the 31st.
    assert local(fires("0 0 31 * *", UTC, at(2026, 1, 31, 1), 2), UTC) == [
        "2026-03-31 00:00:00+0000",
        "2026-05-31 00:00:00+0000",
    ]


def test_five_and_six_fields_are_told_apart_by_token_count():  # CRON-08, spec §3.2
    five = CronExpression.parse("*/15 * * * *")
    six = CronExpression.parse("*/15 * * * * *")
    assert not five.has_seconds and six.has_seconds
    start = at(2026, 1, 1)
    assert fires("*/15 * * * *", UTC, start, 2) == [at(2026, 1, 1, 0, 15), at(2026, 1, 1, 0, 30)]
    assert fires("*/15 * * * * *", UTC, start, 2) == [at(2026, 1, 1, 0, 0, 15), at(2026, 1, 1, 0, 0, 30)]
    # A 5-field expression fires at second 0 of the matching minute.
    assert fires("* * * * *", UTC, at(2026, 1, 1, 0, 0, 30), 1) == [at(2026, 1, 1, 0, 1)]


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # The spec's examples (§3.3).
        ("* * * * *", at(2026, 1, 1, 0, 0), [at(2026, 1, 1, 0, 1), at(2026, 1, 1, 0, 2)]),
        ("1,15 * * * *", at(2026, 1, 1, 0, 0), [at(2026, 1, 1, 0, 1), at(2026, 1, 1, 0, 15), at(2026, 1, 1, 1, 1)]),
        ("1-5 * * * *", at(2026, 1, 1, 0, 3), [at(2026, 1, 1, 0, 4), at(2026, 1, 1, 0, 5), at(2026, 1, 1, 1, 1)]),
        ("*/15 * * * *", at(2026, 1, 1, 0, 50), [at(2026, 1, 1, 1, 0), at(2026, 1, 1, 1, 15)]),
        ("0 0 L * *", at(2026, 2, 1), [at(2026, 2, 28), at(2026, 3, 31)]),
        ("0 0 * * 5#3", at(2026, 1, 1), [at(2026, 1, 16), at(2026, 2, 20)]),  # third Friday
        ("0 0 * * 5L", at(2026, 1, 1), [at(2026, 1, 30), at(2026, 2, 27)]),  # last Friday
        ("0 0 LW * *", at(2026, 5, 1), [at(2026, 5, 29)]),  # last weekday (31st is a Sunday)
        # Ranges with steps, lists of ranges.
        ("0 9-17/4 * * *", at(2026, 1, 1), [at(2026, 1, 1, 9), at(2026, 1, 1, 13), at(2026, 1, 1, 17)]),
        ("0 0 1,15 */6 *", at(2026, 1, 2), [at(2026, 1, 15), at(2026, 7, 1)]),
    ],
)
def test_special_characters(expression, after, expected):  # CRON-09, CRON-S01
    assert fires(expression, UTC, after, len(expected)) == expected


def test_nearest_weekday():  # spec §3.3: "0 0 15W * *" = nearest weekday to the 15th
    assert fires("0 0 15W * *", UTC, at(2026, 1, 1), 3) == [
        at(2026, 1, 15),  # a Thursday: that day
        at(2026, 2, 16),  # the 15th is a Sunday: Monday
        at(2026, 3, 16),  # a Sunday again
    ]
    assert fires("0 0 15W * *", UTC, at(2026, 8, 1), 1) == [at(2026, 8, 14)]  # a Saturday: Friday
    # Never into another month: 1W on a Saturday is Monday the 3rd, 31W on a Sunday Friday the 29th.
    assert fires("0 0 1W * *", UTC, at(2026, 7, 31), 1) == [at(2026, 8, 3)]
    assert fires("0 0 31W * *", UTC, at(2026, 5, 1), 1) == [at(2026, 5, 29)]
    # A month without the day: no fire (31W: none in April).
    assert fires("0 0 31W * *", UTC, at(2026, 4, 1), 1) == [at(2026, 5, 29)]
    assert fires("0 0 15w * *", UTC, at(2026, 1, 1), 1) == [at(2026, 1, 15)]


@pytest.mark.parametrize(
    "expression", ["0 0 1-5W * *", "0 0 1,15W * *", "0 0 0W * *", "0 0 32W * *", "0 0 W * *", "0 0 15W * MON"]
)
def test_bad_nearest_weekday_forms(expression):
    with pytest.raises(ValidationError) as raised:
        CronExpression.parse(expression)
    assert raised.value.field == "cron"


def test_names_are_case_insensitive_and_sunday_is_0_and_7():  # CRON-10, spec §3.4
    start = at(2026, 1, 1)  # a Thursday
    by_number = fires("0 12 * 1-3 1-5", UTC, start, 5)
    assert fires("0 12 * JAN-MAR MON-FRI", UTC, start, 5) == by_number
    assert fires("0 12 * jan-Mar mon-fri", UTC, start, 5) == by_number
    sundays = fires("0 0 * * 0", UTC, start, 3)
    assert fires("0 0 * * 7", UTC, start, 3) == sundays == fires("0 0 * * SUN", UTC, start, 3)
    assert sundays[0] == at(2026, 1, 4)


@pytest.mark.parametrize("macro", sorted(MACROS))
def test_macros_are_their_expressions(macro):  # CRON-12
    start = at(2026, 3, 14, 15, 9, 26)
    assert fires(macro, UTC, start, 3) == fires(MACROS[macro], UTC, start, 3)
    assert fires(macro.upper(), UTC, start, 1) == fires(MACROS[macro], UTC, start, 1)


def test_macro_vectors():
    start = at(2026, 2, 12, 20, 15)  # a Thursday
    assert fires("@hourly", UTC, start, 1) == [at(2026, 2, 12, 21)]
    assert fires("@daily", UTC, start, 1) == fires("@midnight", UTC, start, 1) == [at(2026, 2, 13)]
    assert fires("@weekly", UTC, start, 1) == [at(2026, 2, 15)]  # Sunday midnight
    assert fires("@monthly", UTC, start, 1) == [at(2026, 3, 1)]
    assert fires("@yearly", UTC, start, 1) == fires("@annually", UTC, start, 1) == [at(2027, 1, 1)]


@pytest.mark.parametrize(
    ("text", "interval"),
    [
        ("@every 30m", timedelta(minutes=30)),
        ("@every 2h", timedelta(hours=2)),
        ("@every 1h30m", timedelta(hours=1, minutes=30)),
        ("@every 45s", timedelta(seconds=45)),
        ("@every 500ms", timedelta(milliseconds=500)),
        ("@every 2h45m30s", timedelta(hours=2, minutes=45, seconds=30)),
        ("@every 1.5h", timedelta(minutes=90)),
    ],
)
def test_every_durations(text, interval):  # CRON-S02, spec §4.1
    assert CronExpression.parse(text).interval == interval


def test_every_is_anchored_not_aligned_to_the_clock():  # spec §4.1: "@every 30m" is not "*/30 * * * *"
    every = CronExpression.parse("@every 30m")
    registered = at(2026, 1, 1, 10, 7, 13)
    assert next_fire(every, UTC, registered, anchor=registered) == at(2026, 1, 1, 10, 37, 13)
    assert next_fire(every, UTC, at(2026, 1, 1, 11, 0), anchor=registered) == at(2026, 1, 1, 11, 7, 13)
    assert next_fire(every, UTC, at(2026, 1, 1, 10, 37, 13), anchor=registered) == at(2026, 1, 1, 11, 7, 13)
    assert next_fire(every, NY, registered, anchor=registered) == at(2026, 1, 1, 10, 37, 13)  # zone-free
    assert fires("*/30 * * * *", UTC, registered, 1) == [at(2026, 1, 1, 10, 30)]


def test_next_fire_is_strictly_after():
    expression = CronExpression.parse("0 9 * * *")
    assert next_fire(expression, UTC, at(2026, 1, 1, 9)) == at(2026, 1, 2, 9)
    assert next_fire(expression, UTC, at(2026, 1, 1, 8, 59, 59, 999999)) == at(2026, 1, 1, 9)


def test_the_spec_response_example_next_run_at():  # spec §8.1: registered 2026-02-12T20:15Z → 2026-02-13T14:00Z
    expression = CronExpression.parse("0 9 * * *")
    assert next_fire(expression, NY, at(2026, 2, 12, 20, 15)) == at(2026, 2, 13, 14)


def test_naive_datetimes_are_refused():
    with pytest.raises(ValidationError):
        next_fire(CronExpression.parse("@daily"), UTC, datetime(2026, 1, 1))


def test_no_occurrence_within_fifty_years_is_none():
    # The 5th Monday of a February: 2044 is the next one, then 2072; a 30-year search from 2045 finds 2072.
    rare = CronExpression.parse("0 0 * 2 MON#5")
    assert next_fire(rare, UTC, at(2026, 1, 1)) == at(2044, 2, 29)
    assert next_fire(CronExpression.parse("0 0 29 2 1"), UTC, at(2026, 1, 1)) is not None  # OR: Feb 29 or Mondays


# --- time zones (spec §5) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "UTC",
        "America/New_York",
        "America/Los_Angeles",
        "Europe/London",
        "Europe/Berlin",
        "Asia/Tokyo",
        "Asia/Kolkata",
        "Australia/Sydney",
        "Pacific/Auckland",
    ],
)
def test_the_specs_valid_zones(name):  # CRON-13
    assert str(parse_timezone(name)) == name


@pytest.mark.parametrize(
    "name", ["+05:00", "-08:00", "UTC+5", "EST", "PST", "CST", "CET", "EST5EDT", "Etc/GMT+5", "Mars/Olympus", "", 5]
)
def test_offsets_and_abbreviations_are_refused(name):  # CRON-14
    with pytest.raises(ValidationError) as raised:
        parse_timezone(name)
    assert raised.value.field == "timezone"


def test_an_expression_is_read_in_its_zone():
    # 09:00 in New York is 14:00 UTC in winter (EST) and 13:00 UTC in summer (EDT).
    assert fires("0 9 * * *", NY, at(2026, 1, 10), 1) == [at(2026, 1, 10, 14)]
    assert fires("0 9 * * *", NY, at(2026, 7, 10), 1) == [at(2026, 7, 10, 13)]
    assert fires("30 5 * * *", parse_timezone("Asia/Kolkata"), at(2025, 12, 31, 23), 1) == [at(2026, 1, 1, 0, 0)]


# --- DST (spec §5.2) ------------------------------------------------------------------------------


def test_spring_forward_skips_the_missing_time_in_new_york():  # CRON-16: the spec's example
    # 2026-03-08: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    assert local(fires("30 2 * * *", NY, at(2026, 3, 6, 12), 3), NY) == [
        "2026-03-07 02:30:00-0500",
        "2026-03-09 02:30:00-0400",
        "2026-03-10 02:30:00-0400",
    ]


def test_spring_forward_skips_the_missing_hour_in_london():  # CRON-16
    # 2026-03-29: 01:00 GMT becomes 02:00 BST.
    assert local(fires("30 1 * * *", LONDON, at(2026, 3, 28, 12), 2), LONDON) == [
        "2026-03-30 01:30:00+0100",
        "2026-03-31 01:30:00+0100",
    ]
    # Every 20 minutes: nothing between 01:00 and 02:00 that morning, no extra fire at 02:00.
    assert local(fires("*/20 * * * *", LONDON, at(2026, 3, 29, 0, 30), 4), LONDON) == [
        "2026-03-29 00:40:00+0000",
        "2026-03-29 02:00:00+0100",
        "2026-03-29 02:20:00+0100",
        "2026-03-29 02:40:00+0100",
    ]


def test_the_occurrences_a_gap_swallowed_are_reported():  # CRON-30 dst_skip
    daily = CronExpression.parse("30 2 * * *")
    # 02:30 EST of 2026-03-08 would have been 07:30Z; a year's window holds that one only.
    assert dst_skipped(daily, NY, at(2026, 1, 1), at(2027, 1, 1)) == [at(2026, 3, 8, 7, 30)]
    assert dst_skipped(daily, NY, at(2026, 3, 8, 7, 30), at(2026, 4, 1)) == []  # (after, until]
    assert dst_skipped(daily, NY, at(2026, 3, 8), at(2026, 3, 8, 7, 30)) == [at(2026, 3, 8, 7, 30)]
    every_20 = dst_skipped(CronExpression.parse("*/20 * * * *"), LONDON, at(2026, 3, 29), at(2026, 3, 30))
    assert every_20 == [at(2026, 3, 29, 1, 0), at(2026, 3, 29, 1, 20), at(2026, 3, 29, 1, 40)]
    assert dst_skipped(daily, NY, at(2026, 10, 1), at(2026, 12, 1)) == []  # fall back swallows nothing
    assert dst_skipped(daily, parse_timezone("UTC"), at(2026, 1, 1), at(2027, 1, 1)) == []
    assert dst_skipped(CronExpression.parse("@every 30m"), NY, at(2026, 3, 8), at(2026, 3, 9)) == []


def test_fall_back_fires_once_at_the_first_occurrence_in_new_york():  # CRON-17: the spec's example
    # 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
    assert local(fires("30 1 * * *", NY, at(2026, 10, 31, 12), 3), NY) == [
        "2026-11-01 01:30:00-0400",
        "2026-11-02 01:30:00-0500",
        "2026-11-03 01:30:00-0500",
    ]


def test_fall_back_from_inside_the_second_pass_does_not_fire_again():  # CRON-17
    expression = CronExpression.parse("30 1 * * *")
    second_pass = datetime(2026, 11, 1, 1, 15, tzinfo=NY, fold=1)  # 01:15 EST, after 01:30 EDT fired
    assert next_fire(expression, NY, second_pass).astimezone(NY).strftime("%d %H:%M%z") == "02 01:30-0500"


def test_fall_back_in_london_every_quarter_hour():  # CRON-17: each wall time of the repeated hour once
    # 2026-10-25: 02:00 BST becomes 01:00 GMT.
    assert local(fires("*/15 * * * *", LONDON, at(2026, 10, 24, 23, 50), 6), LONDON) == [
        "2026-10-25 01:00:00+0100",
        "2026-10-25 01:15:00+0100",
        "2026-10-25 01:30:00+0100",
        "2026-10-25 01:45:00+0100",
        "2026-10-25 02:00:00+0000",
        "2026-10-25 02:15:00+0000",
    ]


def test_dst_rules_for_six_field_expressions():
    # Every 30 s around the New York spring gap: 01:59:30 EST, then 03:00:00 EDT.
    assert local(fires("*/30 * * * * *", NY, at(2026, 3, 8, 6, 59), 3), NY) == [
        "2026-03-08 01:59:30-0500",
        "2026-03-08 03:00:00-0400",
        "2026-03-08 03:00:30-0400",
    ]


# --- the evaluation loop's catch-up (spec §7.3) --------------------------------------------------------


def test_not_due_keeps_the_next_run():
    expression = CronExpression.parse("0 9 * * *")
    result = due(expression, UTC, at(2026, 1, 2, 9), at(2026, 1, 2, 8, 59, 59))
    assert (result.fire_at, result.caught_up, result.next_run_at) == (None, False, at(2026, 1, 2, 9))


def test_due_on_time_fires_that_occurrence():
    expression = CronExpression.parse("*/5 * * * *")
    result = due(expression, UTC, at(2026, 1, 1, 10, 5), at(2026, 1, 1, 10, 5, 0, 200_000))
    assert (result.fire_at, result.caught_up, result.next_run_at) == (
        at(2026, 1, 1, 10, 5),
        False,
        at(2026, 1, 1, 10, 10),
    )


def test_a_ten_minute_pause_fires_one_catch_up():  # CRON-25: the spec's example
    expression = CronExpression.parse("* * * * *")
    result = due(expression, UTC, at(2026, 1, 1, 10, 0), at(2026, 1, 1, 10, 10, 30))
    assert result.fire_at == at(2026, 1, 1, 10, 10)  # one occurrence, the latest missed
    assert result.caught_up
    assert result.next_run_at == at(2026, 1, 1, 10, 11)  # the next future occurrence
    # Evaluating again at once fires nothing more.
    again = due(expression, UTC, result.next_run_at, at(2026, 1, 1, 10, 10, 31))
    assert again.fire_at is None


def test_a_long_outage_of_an_every_second_job_is_one_catch_up():  # and cheap: no step per missed second
    expression = CronExpression.parse("* * * * * *")
    result = due(expression, UTC, at(2026, 1, 1), at(2026, 1, 9, 0, 0, 0, 500_000))
    assert (result.fire_at, result.next_run_at) == (at(2026, 1, 9), at(2026, 1, 9, 0, 0, 1))


def test_catch_up_across_a_fall_back_fires_once():
    expression = CronExpression.parse("30 1 * * *")
    result = due(expression, NY, at(2026, 11, 1, 5, 30), datetime(2026, 11, 1, 1, 45, tzinfo=NY, fold=1))
    assert result.fire_at == at(2026, 11, 1, 5, 30) and not result.caught_up
    assert result.next_run_at == at(2026, 11, 2, 6, 30)


def test_every_catch_up_stays_on_its_grid():
    expression = CronExpression.parse("@every 1h30m")
    registered = at(2026, 1, 1, 0, 0)
    result = due(expression, UTC, at(2026, 1, 1, 1, 30), at(2026, 1, 1, 5, 0), anchor=registered)
    assert (result.fire_at, result.caught_up, result.next_run_at) == (
        at(2026, 1, 1, 4, 30),
        True,
        at(2026, 1, 1, 6, 0),
    )


def test_evaluation_delay_is_within_one_and_sixty_seconds():  # CRON-24, spec §7.3
    now = at(2026, 1, 1)
    assert evaluation_delay([], now) == 60
    assert evaluation_delay([None], now) == 60
    assert evaluation_delay([now + timedelta(seconds=7.5), now + timedelta(hours=1)], now) == 7.5
    assert evaluation_delay([now - timedelta(seconds=5)], now) == 1
    assert evaluation_delay([now + timedelta(milliseconds=200)], now) == 1
    assert evaluation_delay([now + timedelta(hours=2)], now) == 60
