"""GPU-hour prices split by how the GPU's time is spent: prompt tokens at the prefill rate, completion tokens at
the decode rate; the older single rate still loads; a price without the throughput it needs is refused with
file:line."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from policies.loader import PolicyError, load_policy, parse_policy
from policies.money import Price
from tests.conftest import with_fixed_threshold

ROOT = Path(__file__).resolve().parents[2]
GOOD = with_fixed_threshold((ROOT / "policies" / "default.yaml").read_text())
MICRO_PRICE = '{input_per_mtok: "0.20", output_per_mtok: "0.20"}'


def _price(**fields: object) -> Price:
    return Price.model_validate(fields)


def test_split_rates_are_the_gpu_seconds_price_over_each_throughput() -> None:
    price = _price(gpu_hour_usd="1.00", prefill_tokens_per_second=4000, decode_tokens_per_second=100)
    # 1 USD/h = 10**6 micro-USD per 3600 s: / (4000 tok/s * 3600 s) per token, x 10**6 per Mtok
    assert (price.input_per_mtok, price.output_per_mtok) == (69_444, 2_777_778)
    assert price.form == "gpu_hour" and (price.prefill_rate, price.decode_rate) == (4000, 100)
    assert price.cost_micro_usd(1_000, 10) == 97  # (69_444_000 + 27_777_780 + 500_000) // 10**6


def test_the_older_single_rate_prices_both_kinds_of_token_alike() -> None:
    price = _price(gpu_hour_usd="2.50", tokens_per_second=2400)
    assert (price.input_per_mtok, price.output_per_mtok, price.gpu_hour_usd) == (289_352, 289_352, 2_500_000)
    assert price.form == "gpu_hour_flat" and (price.prefill_rate, price.decode_rate) == (2400, 2400)
    assert price.cost_micro_usd(1_000_000, 1_000_000) == 578_704


def test_a_long_prompt_costs_less_than_under_the_flat_rate_when_prefill_is_faster() -> None:
    flat = _price(gpu_hour_usd="2.50", tokens_per_second=2400)  # what gpu.yaml's micro pool had
    split = load_policy(ROOT / "policies" / "gpu.yaml").policy.pools["micro"].price
    assert split.gpu_hour_usd == flat.gpu_hour_usd and split.decode_tokens_per_second == flat.tokens_per_second
    long_prompt = (8_000, 100)  # a document and a short answer
    assert split.cost_micro_usd(*long_prompt) < flat.cost_micro_usd(*long_prompt) / 5
    assert split.cost_micro_usd(0, 1_000_000) == flat.cost_micro_usd(0, 1_000_000)  # decode time costs the same


def test_the_shipped_gpu_policy_prices_prompt_tokens_below_completion_tokens() -> None:
    pools = load_policy(ROOT / "policies" / "gpu.yaml").policy.pools
    assert pools["flagship"].price.input_per_mtok == 86_806  # 5.00 USD/h at 16,000 prompt tok/s
    assert pools["flagship"].price.output_per_mtok == 771_605  # and at 1,800 completion tok/s
    for name in ("micro", "flagship"):
        assert pools[name].price.form == "gpu_hour"
        assert pools[name].price.input_per_mtok < pools[name].price.output_per_mtok


def test_old_and_new_rates_together_must_agree() -> None:
    both = _price(gpu_hour_usd="1.00", prefill_tokens_per_second=4000, decode_tokens_per_second=100,
                  tokens_per_second=400)  # a blend of the two: kept, the split rates price
    assert (both.input_per_mtok, both.output_per_mtok) == (69_444, 2_777_778)


def _problem(price: str) -> str:
    text = GOOD.replace(MICRO_PRICE, price, 1)
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    (problem,) = err.value.problems
    line = next(i for i, row in enumerate(text.splitlines(), 1) if price in row)
    assert problem.startswith(f"p.yaml:{line}: pools.micro.price: "), problem
    assert "\n" not in problem and "Traceback" not in problem
    return problem


@pytest.mark.parametrize(("price", "says"), [
    ('{gpu_hour_usd: "1.00"}', "gpu_hour_usd needs the measured throughput of one replica: "
                               "prefill_tokens_per_second and decode_tokens_per_second"),
    ('{gpu_hour_usd: "1.00", prefill_tokens_per_second: 0, decode_tokens_per_second: 100}',
     "prefill_tokens_per_second must be a number > 0 (tokens/s of one replica), got 0"),
    ('{gpu_hour_usd: "1.00", prefill_tokens_per_second: 4000, decode_tokens_per_second: -5}',
     "decode_tokens_per_second must be a number > 0 (tokens/s of one replica), got -5"),
    ('{gpu_hour_usd: "1.00", prefill_tokens_per_second: 4000, decode_tokens_per_second: fast}',
     "decode_tokens_per_second must be a number > 0"),
    ('{gpu_hour_usd: "1.00", tokens_per_second: 0}', "tokens_per_second must be a number > 0"),
    ('{gpu_hour_usd: "1.00", prefill_tokens_per_second: 4000}',
     "give both prefill_tokens_per_second and decode_tokens_per_second"),
    ('{gpu_hour_usd: "1.00", prefill_tokens_per_second: 4000, decode_tokens_per_second: 100, tokens_per_second: 9000}',
     "tokens_per_second 9000 is not between decode_tokens_per_second 100 and prefill_tokens_per_second 4000"),
    ('{input_per_mtok: "0.20", output_per_mtok: "0.20", gpu_hour_usd: 1, tokens_per_second: 100}', "not both"),
])
def test_a_gpu_hour_price_without_the_throughput_it_needs_is_refused_with_file_line(price: str, says: str) -> None:
    assert says in _problem(price)


@pytest.mark.parametrize(("price", "loads"), [
    ({"input_per_mtok": "0.2", "output_per_mtok": "0.6"}, True),
    ({"gpu_hour_usd": "1", "prefill_tokens_per_second": 4000, "decode_tokens_per_second": 100}, True),
    ({"gpu_hour_usd": "1", "tokens_per_second": 400}, True),
    ({"gpu_hour_usd": "1", "prefill_tokens_per_second": 4000, "decode_tokens_per_second": 100,
      "tokens_per_second": 400}, True),
    ({"gpu_hour_usd": "1"}, False),
    ({"gpu_hour_usd": "1", "prefill_tokens_per_second": 4000, "tokens_per_second": 400}, False),
    ({"gpu_hour_usd": "1", "decode_tokens_per_second": 0, "prefill_tokens_per_second": 10}, False),
    ({"input_per_mtok": "0.2", "output_per_mtok": "0.6", "gpu_hour_usd": "1", "tokens_per_second": 400}, False),
])
def test_the_json_schema_editors_check_against_agrees_with_the_loader(price: dict[str, object], loads: bool) -> None:
    validator = jsonschema.Draft202012Validator(Price.model_json_schema())
    assert validator.is_valid(price) == loads
    try:
        Price.model_validate(price)
    except ValueError:
        assert not loads
    else:
        assert loads
