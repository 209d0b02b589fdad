"""`check_settings` remembers the settings it found usable by the values of `SETTINGS`."""

import pathlib
import re

import pytest

from codegen import config
from codegen.config import SettingError


def test_settings_names_every_variable_the_config_reads():
    source = pathlib.Path(config.__file__).read_text()
    read = set(re.findall(r'"(TENSORDSL_[A-Z_]+)"', source))
    assert read == set(config.SETTINGS)


@pytest.mark.parametrize("name", ["TENSORDSL_BUILD_JOBS", "TENSORDSL_XLA_CONTRACTIONS"])
def test_a_setting_changed_after_a_check_is_checked_again(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    config.check_settings()
    monkeypatch.setenv(name, "not-a-value")
    with pytest.raises(SettingError, match=name):
        config.check_settings()
