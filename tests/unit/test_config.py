"""The daemon's config file: every setting parsed, bad values refused with one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.daemon.config import Config, read_config
from gpuwarden.errors import UsageError
from gpuwarden.sched.limits import Limits, UserLimits

GiB = 1 << 30


def test_starve_after_defaults_to_fifteen_minutes(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text('aging = "1h"\n')
    assert read_config(p).policy.starve_after == 900 == Config().policy.starve_after


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    c = read_config(tmp_path / "none.toml")
    assert c.policy.backfill and c.policy.preemption and c.policy.aging == 3600
    assert c.policy.limits == Limits()


def test_every_setting(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text(
        'admin_groups = ["gpuadmin"]\nspike_buffer = 0.2\nreserve = "1G"\n'
        'interval = "1s"\ngrace = "30s"\naging = "30m"\nbackfill = false\n'
        'preemption = false\nretry_backoff = "1m"\nhistory_interval = "30s"\n'
        'history_retention = "7d"\nweb_listen = ":9403"\nstarve_after = "2s"\n'
        '[limits]\nmax_gpus = 4\nmax_memory = "160G"\nmax_running = 8\n'
        "[limits.users.alice]\nmax_gpus = 8\n"
    )
    c = read_config(p)
    assert c.admin_groups == ("gpuadmin",) and c.spike_buffer == 0.2 and c.reserve == GiB
    assert c.interval == 1 and c.grace == 30 and c.retry_backoff == 60
    assert c.history_interval == 30 and c.history_retention == 7 * 86400
    assert c.web_listen == ":9403"
    assert c.policy.aging == 1800 and not c.policy.backfill and not c.policy.preemption
    assert c.policy.starve_after == 2
    assert c.policy.limits.default == UserLimits(max_gpus=4, max_memory=160 * GiB, max_running=8)
    assert c.policy.limits.of("alice") == UserLimits(max_gpus=8)
    assert c.policy.limits.of("bob") == c.policy.limits.default


@pytest.mark.parametrize(
    "text,needle",
    [
        ("backfill = 1", "backfill must be true or false"),
        ("[limits]\nmax_gpus = -1", "limits.max_gpus must be a whole number"),
        ("[limits]\nmax_cpus = 1", "unknown setting(s) max_cpus"),
        ("[limits.users]\nalice = 3", "limits.users.alice must be a table"),
        ("limits = 3", "limits must be a table"),
        ('aging = "soon"', "soon"),
        ("colour = 1", "unknown setting(s) colour"),
        ("web_listen = 9403", "web_listen must be HOST:PORT"),
        ('web_listen = "everywhere"', "web_listen: invalid listen address"),
        ('history_interval = "often"', "often"),
        ('starve_after = "soon"', "starve_after: invalid duration 'soon'"),
        ("starve_after = -1", "starve_after: invalid duration -1"),
        ("starve_after = true", "starve_after must be a duration like 15m"),
        ("starve_after = nan", "starve_after: invalid duration nan"),
        ("oom_retries = -1", "oom_retries must be a whole number from 0 to 100"),
        ("oom_retries = true", "oom_retries must be a whole number"),
        ('oom_retries = "1"', "oom_retries must be a whole number"),
    ],
)
def test_bad_settings_are_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "config.toml"
    p.write_text(text + "\n")
    with pytest.raises(UsageError, match=None) as err:
        read_config(p)
    assert needle in str(err.value)


def test_oom_retries_default_to_one_and_may_be_turned_off(tmp_path: Path) -> None:
    assert read_config(tmp_path / "none.toml").oom_retries == 1
    p = tmp_path / "config.toml"
    p.write_text("oom_retries = 0\n")
    assert read_config(p).oom_retries == 0
