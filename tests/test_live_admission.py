"""How a live run maps ``engine.admission`` and its knobs onto an SGLang server, without a server.

The live checks (the server really retracts, and agrees with the simulator) are in
``tests/live/test_live_server.py``; here: the per-request sampling parameters, the EOS ids read from a model
folder, the environment the server is started with, and the refusal of knobs a ``--url`` server cannot honour.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from prism.errors import UserError
from prism.live.model import resolve_model
from prism.live.requests import EOS_BAN, length_params
from prism.live.server import ADMISSION_ENV, admission_env, check_attachable
from prism.settings import EngineConfig


def test_full_admission_ignores_eos_and_sglang_admission_bans_it():
    assert length_params(7, "full", (2,)) == {"max_new_tokens": 7, "ignore_eos": True}
    p = length_params(7, "sglang", (2, 5))
    assert p["ignore_eos"] is False and p["max_new_tokens"] == 7
    assert p["logit_bias"] == {"2": EOS_BAN, "5": EOS_BAN}
    assert "logit_bias" not in length_params(7, "sglang", ())  # nothing to ban: the length is already forced
    assert "min_new_tokens" not in p  # SGLang refuses it without a tokenizer (--skip-tokenizer-init)


@pytest.mark.parametrize("config,generation,expected", [
    ({"eos_token_id": 2}, None, (2,)),
    ({"eos_token_id": [7, 3]}, {"eos_token_id": 9}, (3, 7, 9)),
    ({"eos_token_id": None}, {"eos_token_id": [4, 99999]}, (4,)),  # outside the vocabulary: never sampled
    ({}, None, ()),
])
def test_eos_ids_come_from_config_and_generation_config(tmp_path, config, generation, expected):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1000, **config}))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    assert resolve_model(str(tmp_path)).eos_ids == expected


def test_a_generated_model_knows_its_eos(tmp_path):
    served = resolve_model("tiny", root=tmp_path)
    assert served.eos_ids == (json.loads((served.path / "config.json").read_text())["eos_token_id"],)


def test_the_server_environment_carries_every_admission_knob():
    engine = EngineConfig(init_new_token_ratio=0.35, min_new_token_ratio_factor=0.5, new_token_ratio_decay_steps=9,
                          retract_decode_steps=3, clip_max_new_tokens=77)
    env = admission_env(engine)
    # every knob whose help names an SGLANG_ variable is passed under that name, and reads back exactly
    named = {f.name: f.metadata["doc"].split(":")[0].split()[0] for f in dataclasses.fields(EngineConfig)
             if f.metadata.get("doc", "").startswith("SGLANG_")}
    assert named == ADMISSION_ENV
    for name, var in ADMISSION_ENV.items():
        assert type(getattr(engine, name))(env[var]) == getattr(engine, name)


def test_a_url_server_refuses_admission_knobs_it_cannot_honour():
    check_attachable(EngineConfig(admission="full", max_total_tokens=1000))  # per request, or checked elsewhere
    with pytest.raises(UserError, match="engine.new_token_ratio_decay_steps.*SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=20"):
        check_attachable(EngineConfig(new_token_ratio_decay_steps=20))
