"""Pydantic's validation errors reach users as the validators' own words: without its "Value error, " prefix
(stare_verl.validation.error_text), across the places that print them."""

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from stare_verl.methods import parse_method_spec
from stare_verl.methods.settings import MethodConfigError
from stare_verl.validation import error_text


class _Probe(BaseModel):
    x: int = 0

    @field_validator("x")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 0:
            raise ValueError("x must be >= 0, not negative")
        assert v != 7, "seven is not allowed"
        return v


@pytest.mark.parametrize(("x", "said"), [(-1, "x must be >= 0, not negative"), (7, "seven is not allowed")])
def test_error_text_is_the_validators_message(x, said):
    with pytest.raises(ValidationError) as err:
        _Probe(x=x)
    (e,) = err.value.errors()
    assert e["msg"] != said and said in e["msg"]  # pydantic frames it
    assert error_text(e) == said


def test_a_method_settings_range_error_reads_as_the_methods_words():
    with pytest.raises(MethodConfigError) as err:
        parse_method_spec("repo_r:zeta=1")
    assert "need zeta_min <= zeta <= zeta_max, got 0.0001, 1.0, 0.05" in str(err.value)
    assert "Value error" not in str(err.value)


def test_the_evaluations_option_errors_name_the_option_without_pydantics_prefix():
    from stare_verl.jobs.evaluation.cli import _validation_line

    with pytest.raises(ValidationError) as err:
        _Probe(x=-1)
    assert _validation_line(err.value) == "x: x must be >= 0, not negative"
