"""The parts the training stages are built from, without a model: what train_info.json records about SFT's data
and what a preference round's metrics.json records about its training."""

from __future__ import annotations

from collections import Counter

from pasta.training.examples import ExampleStats, PromiseBalance
from pasta.training.pref import round_train_metrics
from pasta.training.sft import SFTData


def test_sft_data_info_is_what_train_info_json_records_about_the_data():
    stats = ExampleStats(max_length=96, num_records=3, num_used=2, skipped=Counter(empty=1))
    balance = PromiseBalance(num_with_promises=1, num_plain=2, upsample=2, num_plain_kept=2, promise_share=0.5)
    data = SFTData(examples=[], stats=stats, balance=balance, baseline=False, data_path="a.jsonl", sha256="abc")
    info = data.info()
    assert list(info) == ["baseline", "data_sha256", "data_path", "examples", "promise_balance"]
    assert info["examples"]["skipped"] == {"empty": 1} and info["promise_balance"]["upsample"] == 2
    unbalanced = SFTData(examples=[], stats=stats, balance=None, baseline=True, data_path=None, sha256="abc")
    assert unbalanced.info()["promise_balance"] is None


def test_a_round_reports_the_loss_and_margin_of_every_logged_step():
    log_history = [{"loss": 2.0, "rewards/margins": 0.1, "step": 1}, {"loss": 1.5, "step": 2},
                   {"train_runtime": 3.0, "step": 2}]
    metrics = round_train_metrics({"train_loss": 1.75}, log_history)
    assert metrics == {"train_loss": 1.75, "loss_history": [2.0, 1.5], "margin_history": [0.1],
                       "last_log": {"loss": 1.5, "step": 2}}
    assert round_train_metrics({}, [])["last_log"] == {}
