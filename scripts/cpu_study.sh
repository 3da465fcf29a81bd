#!/usr/bin/env bash
# The CPU study: does PASTA buy a user wall-clock time at equal quality, on prompts no stage trained on?
#   annotate the study's data (default data=alpaca_eval_gpt4_mix: GPT-4 answers to the AlpacaEval prompts outside the
#   held-out pool, then the shared 5K Alpaca; structural teacher) -> SFT (by default the promise-bearing records, 3.5
#   epochs) -> Baseline-SFT (same records, tags stripped, three epochs) -> Baseline-SFT decoded on the held-out prompts
#   -> a lambda sweep x rounds of the preference stage, each lambda chained from the SFT model, scored against
#   Baseline-SFT's own answers (stage.reference=baseline: the latency speed reward counts a candidate's steps against
#   them) -> the SFT model and each lambda's last round (PASTA_STUDY_EVAL_ROUNDS=all: every round) decoded on the same
#   held-out prompts -> the report table and the study plot (speedup vs the embedding-similarity proxy, one line per
#   lambda).
# Every step resumes: rerun the same command after a kill and finished work is skipped (training from its last
# checkpoint, a sweep between rounds without redoing a round, evaluation from the last decoded prompt). Round 1
# samples the same candidates for every lambda (same start, prompts and seeds), so later lambdas reuse the first
# lambda's round-1 samples and Baseline-SFT answers instead of decoding them again.
#
# Every answer gets the same budget: max_new_tokens tokens, every thread's together for the PASTA models (the
# default of decode.max_total_tokens), as a sequential answer's.
#
# How speed is measured: every model decodes the held-out prompts in batches (eval.timing=throughput) except the
# first PASTA_STUDY_TIMED_PROMPTS, decoded one at a time after a warm-up: their per-prompt wall-clock speedups against
# Baseline-SFT are measured, and each forked one is replayed as its own plain text, one token per step, by the same
# model (eval.parallelism: the part of the speedup that is parallel decoding, not a shorter answer). For every
# prompt, the cost model prices each answer's steps on the forward cost by rows measured in Baseline-SFT's run (c(q),
# step_costs.json): the cost-model speedup, beside the measured one.
#
#   scripts/cpu_study.sh                                  # outputs/study/, the embedded SmolLM2-135M
#   PASTA_STUDY_DIR=/tmp/s PASTA_STUDY_LAMBDAS="1 inf" scripts/cpu_study.sh
#   PASTA_STUDY_STOP_AFTER=sft scripts/cpu_study.sh          # stop after SFT and Baseline-SFT ($dir/sft/final, ...)
#   PASTA_STUDY_EVAL_ROUNDS=all scripts/cpu_study.sh         # decode every round, not only the last
#   PASTA_STUDY_BASELINE_SFT_ARGS="..." scripts/cpu_study.sh # Baseline-SFT's own SFT overrides
#   PASTA_STUDY_NO_REPEAT=0 scripts/cpu_study.sh             # no repetition guard (the studies before 2026-11-26)
#   PASTA_STUDY_DRAFT=0 scripts/cpu_study.sh                 # no skeleton draft (the studies before 2026-11-28)
#
# Sizes come from the environment (the test suite runs this script on a tiny random model); every PASTA_STUDY_* setting
# is checked before step 1 (one `error:` line and exit code 2 for a bad one). The quality numbers are
# offline proxies (embedding similarity to AlpacaEval's GPT-4 Turbo answers, distinct-n, length ratio), labelled as
# such; the embedded 135M judge's win rate is left out (in the 2026-11-24 study it read 49.7-50.5 for every model).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PASTA_VENV:-.venv}/bin/python
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
out=${PASTA_STUDY_DIR:-outputs/study}
model=${PASTA_STUDY_MODEL:-smollm2-135m}
# conf/data/: the records the teacher annotates (alpaca_5k: the old study)
data=${PASTA_STUDY_DATA:-alpaca_eval_gpt4_mix}
eval_data=${PASTA_STUDY_EVAL_DATA:-alpaca_eval}       # conf/eval_data/: the held-out prompts
num_records=${PASTA_STUDY_RECORDS:-null}              # records annotated (null = all)
# Teacher overrides. The default has the chunks write their bold leads (the main thread keeps markers and numbers):
# the student trained on it reached 1.51x theoretical (docs/results/study.md, "Three levers");
# PASTA_STUDY_TEACHER_ARGS="" = the teacher's defaults.
teacher_args=${PASTA_STUDY_TEACHER_ARGS-teacher.leads_in_main=false}
# The PASTA student's SFT overrides. The default trains on the promise-bearing records only, with the opening lists of
# one-word leads trained plain: on this data the recipe measured to fork (docs/results/study.md, "The SFT lever" and
# "Opening lists trained plain"); 3.5 epochs, where three fork on fewer than half the answers and four cost the
# quality proxy ("Three and a half SFT epochs"); PASTA_STUDY_SFT_ARGS="" = the stage defaults.
recipe="data.plain_per_promise=0 data.min_lead_words=2"  # both students' data recipe; the epochs differ
sft_args=${PASTA_STUDY_SFT_ARGS-$recipe stage.num_train_epochs=3.5}
# Baseline-SFT's SFT overrides, on its own: the same recipe at three epochs (a longer Baseline-SFT moves every length
# ratio: docs/results/study.md, "Four SFT epochs"). They do not follow PASTA_STUDY_SFT_ARGS: give every override
# Baseline-SFT should train with (PASTA_STUDY_BASELINE_SFT_ARGS="" = the stage defaults).
baseline_sft_args=${PASTA_STUDY_BASELINE_SFT_ARGS-$recipe stage.num_train_epochs=3}
lambdas=${PASTA_STUDY_LAMBDAS:-1 4 inf}               # stage.quality_weight of each sweep line
# Two rounds per lambda at 48 prompts a round: the study's time on 2 cores is in docs/results/study.md.
num_rounds=${PASTA_STUDY_ROUNDS:-2}
# Which rounds are decoded on the held-out prompts: last (each lambda's last round, what the study's targets read; an
# evaluation is ~10 min here, so two rounds x three lambdas decode 3 models instead of 6) or all (every round: the
# plot's lines pass through each).
eval_rounds=${PASTA_STUDY_EVAL_ROUNDS:-last}
num_prompts=${PASTA_STUDY_PREF_PROMPTS:-48}           # preference prompts per round (N samples each)
num_samples=${PASTA_STUDY_SAMPLES:-4}
# Preference overrides. The default gives each prompt two pairs, its best fork against the same words untagged and
# best vs worst within 20% of the chosen answer's length, at beta 1: the pairing of the sweeps in
# docs/results/study.md since 2026-11-28; PASTA_STUDY_PREF_ARGS="" = the stage defaults.
pref_args=${PASTA_STUDY_PREF_ARGS-stage.rejected_side=both stage.pair_length_tolerance=0.2 stage.beta=1}
num_eval=${PASTA_STUDY_EVAL_PROMPTS:-100}             # held-out prompts (eval.subset, seed 0)
num_timed=${PASTA_STUDY_TIMED_PROMPTS:-20}            # of them, decoded one at a time (measured wall clock)
# The answer budget: near the p90 of the answers the students learn (233 tokens in the default SFT set), so that it
# cuts few of Baseline-SFT's answers (the study reports how many: the report's budget-cut column).
max_new_tokens=${PASTA_STUDY_MAX_NEW_TOKENS:-320}
# The repetition guard of every decode (decode.sampling.no_repeat_ngram_size): both students' evaluations and the
# preference rounds' candidates, so that the rounds score the answers the evaluation sees; 0 = off. Why 3: the sweep
# in docs/results/study.md ("The repetition guard swept").
no_repeat=${PASTA_STUDY_NO_REPEAT:-3}
# The skeleton draft in every PASTA decode (decode.draft_skeleton, stage.draft_skeleton): the evaluations' greedy
# answers and the rounds' candidates in fewer steps, the same answers (docs/results/study.md, "The promise list's
# skeleton drafted"), so the rounds' speed reward counts the steps the evaluation takes; 0 = off, as the studies before
# 2026-11-28 decoded.
draft=${PASTA_STUDY_DRAFT:-1}
stop_after=${PASTA_STUDY_STOP_AFTER:-}                # sft: stop after SFT and Baseline-SFT

# --- settings check: every PASTA_STUDY_* setting above, before step 1 -----------------------------------------------
# A bad one is one `error:` line and exit code 2 now, not a failure at the step that uses it, hours in. Each setting
# is passed as NAME=value; the stages' own checks (pasta.cli.check_command_line) run on the configs the steps compose,
# so an override in PASTA_STUDY_SFT_ARGS / PASTA_STUDY_BASELINE_SFT_ARGS / PASTA_STUDY_PREF_ARGS is checked too. A new
# setting: pass it here and check it in the Python below.
"$python" - "PASTA_STUDY_DIR=$out" "PASTA_STUDY_MODEL=$model" "PASTA_STUDY_DATA=$data" \
    "PASTA_STUDY_EVAL_DATA=$eval_data" "PASTA_STUDY_RECORDS=$num_records" "PASTA_STUDY_TEACHER_ARGS=$teacher_args" \
    "PASTA_STUDY_SFT_ARGS=$sft_args" "PASTA_STUDY_BASELINE_SFT_ARGS=$baseline_sft_args" \
    "PASTA_STUDY_LAMBDAS=$lambdas" "PASTA_STUDY_ROUNDS=$num_rounds" "PASTA_STUDY_EVAL_ROUNDS=$eval_rounds" \
    "PASTA_STUDY_PREF_PROMPTS=$num_prompts" \
    "PASTA_STUDY_SAMPLES=$num_samples" "PASTA_STUDY_PREF_ARGS=$pref_args" "PASTA_STUDY_EVAL_PROMPTS=$num_eval" \
    "PASTA_STUDY_TIMED_PROMPTS=$num_timed" "PASTA_STUDY_MAX_NEW_TOKENS=$max_new_tokens" \
    "PASTA_STUDY_NO_REPEAT=$no_repeat" "PASTA_STUDY_DRAFT=$draft" "PASTA_STUDY_STOP_AFTER=$stop_after" <<'PY'
import re
import sys

from pasta.cli import check_command_line, fail
from pasta.config import compose
from pasta.errors import PastaError

settings = dict(arg.split("=", 1) for arg in sys.argv[1:])


def integer(name: str, low: int, high: int | None = None, why: str = "") -> int:
    value = settings[name]
    if not re.fullmatch(r"[0-9]+", value) or int(value) < low or (high is not None and int(value) > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        fail(PastaError(f"{name}={value} must be an integer {bound}{why}"))
    return int(value)


def checked(name: str, config_name: str, overrides: list[str], stage: str | None = None) -> None:
    """The config a step composes from this setting passes that stage's own checks (and is that training stage)."""
    try:
        check_command_line(config_name, overrides)
    except PastaError as exc:
        fail(PastaError(f"{name}: {exc}"))
    if stage is not None and compose(config_name, overrides).stage.kind != stage:
        fail(PastaError(f"{name}: overrides the stage, which this step sets (stage={stage})"))


if settings["PASTA_STUDY_STOP_AFTER"] not in ("", "sft"):
    fail(PastaError(f"PASTA_STUDY_STOP_AFTER={settings['PASTA_STUDY_STOP_AFTER']}: use sft (stop after SFT and "
                    "Baseline-SFT) or leave it unset"))
lambdas = settings["PASTA_STUDY_LAMBDAS"].split()
if not lambdas:
    fail(PastaError("PASTA_STUDY_LAMBDAS is empty: give the quality weights of the sweep, e.g. \"1 4 inf\""))
for value in lambdas:
    if not re.fullmatch(r"inf|[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?", value):
        fail(PastaError(f"PASTA_STUDY_LAMBDAS: {value!r} is not a number >= 0 or inf (e.g. \"1 4 inf\")"))
num_rounds = integer("PASTA_STUDY_ROUNDS", 1)
if settings["PASTA_STUDY_EVAL_ROUNDS"] not in ("last", "all"):
    fail(PastaError(f"PASTA_STUDY_EVAL_ROUNDS={settings['PASTA_STUDY_EVAL_ROUNDS']}: use last (each lambda's last "
                    "round) or all (every round)"))
integer("PASTA_STUDY_PREF_PROMPTS", 1)
integer("PASTA_STUDY_SAMPLES", 2, why=" (a preference pair needs two candidates)")
max_new_tokens = integer("PASTA_STUDY_MAX_NEW_TOKENS", 1)
no_repeat = integer("PASTA_STUDY_NO_REPEAT", 0, why=" (0 = off)")
integer("PASTA_STUDY_DRAFT", 0, 1, " (1 = the skeleton draft, 0 = off)")
if settings["PASTA_STUDY_RECORDS"] != "null":
    integer("PASTA_STUDY_RECORDS", 1, why=" or null (every record)")

out, model = settings["PASTA_STUDY_DIR"], settings["PASTA_STUDY_MODEL"]
common = [f"paths.output_root={out}", "device=cpu", f"model={model}"]
checked("PASTA_STUDY_MODEL / PASTA_STUDY_DATA / PASTA_STUDY_RECORDS / PASTA_STUDY_TEACHER_ARGS", "annotate",
        [*common, "teacher=structural", f"data={settings['PASTA_STUDY_DATA']}",
         f"data.limit={settings['PASTA_STUDY_RECORDS']}", "on_reject=keep_unannotated", f"output={out}/annotated.jsonl",
         *settings["PASTA_STUDY_TEACHER_ARGS"].split()])
train = [*common, f"data.path={out}/annotated.jsonl", "resume=true"]
checked("PASTA_STUDY_SFT_ARGS", "train", ["stage=sft", *train, f"output_dir={out}/sft",
                                          *settings["PASTA_STUDY_SFT_ARGS"].split()], stage="sft")
checked("PASTA_STUDY_BASELINE_SFT_ARGS", "train", ["stage=sft", *train, "data.strip_annotations=true",
                                                   f"output_dir={out}/baseline-sft",
                                                   *settings["PASTA_STUDY_BASELINE_SFT_ARGS"].split()], stage="sft")
for value in lambdas:
    checked("PASTA_STUDY_LAMBDAS / PASTA_STUDY_PREF_ARGS", "train", [
        "stage=pref", *train, f"model.path={out}/sft/final", f"stage.quality_weight={value}",
        f"stage.rounds={num_rounds}", f"stage.prompts_per_round={settings['PASTA_STUDY_PREF_PROMPTS']}",
        f"stage.num_samples={settings['PASTA_STUDY_SAMPLES']}", f"stage.max_new_tokens={max_new_tokens}",
        f"stage.no_repeat_ngram_size={no_repeat}", "stage.reference=baseline",
        f"stage.baseline_model={out}/baseline-sft/final", f"output_dir={out}/pref",
        *settings["PASTA_STUDY_PREF_ARGS"].split()], stage="pref")

# torch and transformers load here, after the checks that need neither, so that a mistyped setting fails at once.
from pasta.data import load_alpaca_eval
from pasta.data.heldout import HELDOUT_POOL_SIZE
from pasta.evaluation.eval_set import ALPACA_EVAL_SIZE
from pasta.models import max_positions

positions = max_positions(compose("generate", common).model)
if positions is not None and max_new_tokens >= positions:
    fail(PastaError(f"PASTA_STUDY_MAX_NEW_TOKENS={max_new_tokens} leaves no room for a prompt in the model's "
                    f"{positions} positions"))

eval_data = settings["PASTA_STUDY_EVAL_DATA"]
try:
    num_prompts = len(load_alpaca_eval(compose("eval", [*common, f"eval_data={eval_data}"]).eval_data))
except PastaError as exc:
    fail(PastaError(f"PASTA_STUDY_EVAL_DATA={eval_data}: {exc}"))
if num_prompts == ALPACA_EVAL_SIZE:  # the study's prompts stay inside the held-out pool its data leaves out
    num_eval = integer("PASTA_STUDY_EVAL_PROMPTS", 1, HELDOUT_POOL_SIZE,
                       f" (the held-out pool of eval_data={eval_data}: data=alpaca_eval_gpt4* trains on the others)")
else:
    num_eval = integer("PASTA_STUDY_EVAL_PROMPTS", 1, num_prompts, f" (eval_data={eval_data} has {num_prompts} prompts)")
integer("PASTA_STUDY_TIMED_PROMPTS", 0, num_eval, " (at most PASTA_STUDY_EVAL_PROMPTS: they are decoded one at a time)")
checked("PASTA_STUDY_EVAL_DATA", "eval", [*common, f"eval_data={eval_data}", f"eval.subset={num_eval}",
                                          f"decode.max_new_tokens={max_new_tokens}",
                                          f"decode.sampling.no_repeat_ngram_size={no_repeat}"])
PY
# --- end of the settings check ----------------------------------------------------------------------------------------

common=("paths.output_root=$out" device=cpu "model=$model")
# shellcheck disable=SC2206  # the extra overrides are meant to split on spaces
train=("${common[@]}" "data.path=$out/annotated.jsonl" resume=true)
# The untimed prompts decode in batches of 32: the same greedy answers as batches of 8, and sooner on 2 cores
# (measured in docs/results/study.md, "The study at its new defaults").
evaluate=("${common[@]}" "eval_data=$eval_data" "eval.subset=$num_eval" eval.subset_seed=0
    "decode.max_new_tokens=$max_new_tokens" "decode.sampling.no_repeat_ngram_size=$no_repeat" eval.timing=throughput \
    eval.batch_size=32 "eval.timed_prompts=$num_timed"
    eval.win_rate=false)
baseline_eval="$out/eval/baseline-sft"
if [ "$draft" = 1 ]; then draft_skeleton=true; else draft_skeleton=false; fi
started=$SECONDS
step() { printf '\n== [%4d s] %s\n' $((SECONDS - started)) "$*"; }
# Done: the run's train_info.json says so, written after its last model, metrics and checks (a run killed after
# its final model but before them resumes and writes them).
done_already() {
    "$python" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("status") != "done")' \
        "$1/train_info.json" 2>/dev/null && echo "   already done: $1"
}
# Run names say lambda and round; "inf" and "1.0" are fine in a folder name.
pref_dir() { echo "$out/pref-lambda$1"; }

step "1/7 prepare the model (converted once into the cache)"
"$python" -m pasta.models prepare "model=$model"

step "2/7 annotate $data with the structural teacher (rule-based, no model)"
# shellcheck disable=SC2086
"$python" -m pasta.annotate "${common[@]}" teacher=structural "data=$data" "data.limit=$num_records" \
    on_reject=keep_unannotated output="$out/annotated.jsonl" $teacher_args

step "3/7 SFT: the annotated records, with ${sft_args:-the stage defaults}"
# shellcheck disable=SC2086
done_already "$out/sft" || "$python" -m pasta.train stage=sft "${train[@]}" output_dir="$out/sft" $sft_args

step "4/7 Baseline-SFT: the same records with the tags stripped, with ${baseline_sft_args:-the stage defaults}"
# shellcheck disable=SC2086
done_already "$out/baseline-sft" || "$python" -m pasta.train stage=sft "${train[@]}" data.strip_annotations=true \
    output_dir="$out/baseline-sft" $baseline_sft_args

if [ "$stop_after" = sft ]; then
    printf '\n== stopped after SFT (PASTA_STUDY_STOP_AFTER=sft) in %d s: %s/sft/final, %s/baseline-sft/final\n' \
        $((SECONDS - started)) "$out" "$out"
    exit 0
fi

step "5/7 decode Baseline-SFT on the $num_eval held-out $eval_data prompts (sequential)"
"$python" -m pasta.eval "${evaluate[@]}" model.path="$out/baseline-sft/final" decode=sequential \
    eval.generator=baseline-sft output_dir="$baseline_eval"

step "6/7 preference: lambda in {$lambdas} x $num_rounds rounds, each lambda from the SFT model"
first=""
for lambda in $lambdas; do
    dir=$(pref_dir "$lambda")
    # (a run of fewer rounds is done too: its last round is not this one)
    if [ -d "$dir/round-$num_rounds/final" ] && done_already "$dir"; then first=${first:-$dir}; continue; fi
    # The same round-1 candidates and Baseline-SFT answers as the first lambda's: paired again, not decoded again.
    reuse=()
    [ -z "$first" ] || reuse=("stage.candidates_from=$first")
    # shellcheck disable=SC2086
    "$python" -m pasta.train stage=pref "${train[@]}" model.path="$out/sft/final" "stage.quality_weight=$lambda" \
        "stage.rounds=$num_rounds" "stage.prompts_per_round=$num_prompts" "stage.num_samples=$num_samples" \
        "stage.max_new_tokens=$max_new_tokens" "stage.no_repeat_ngram_size=$no_repeat" stage.reference=baseline \
        stage.baseline_model="$out/baseline-sft/final" "stage.draft_skeleton=$draft_skeleton" output_dir="$dir" \
        "${reuse[@]}" $pref_args
    first=${first:-$dir}
done

runs=("sft:$out/sft/final")
if [ "$eval_rounds" = all ]; then first_round=1; else first_round=$num_rounds; fi
for lambda in $lambdas; do
    for round in $(seq "$first_round" "$num_rounds"); do
        runs+=("lambda$lambda-round$round:$(pref_dir "$lambda")/round-$round/final")
    done
done
for run in "${runs[@]}"; do
    name=pasta-${run%%:*}
    step "   decode $name on the same prompts"
    # Baseline-SFT decodes each timed prompt again right after the PASTA answer: the wall-clock speedup divides two
    # times taken side by side (this machine ran 1.2x faster at one hour than at another: docs/results/study.md).
    "$python" -m pasta.eval "${evaluate[@]}" model.path="${run#*:}" decode=async \
        "decode.draft_skeleton=$draft_skeleton" \
        eval.reference="$baseline_eval" eval.sequential="$baseline_eval" \
        eval.sequential_model="$out/baseline-sft/final" eval.generator="$name" output_dir="$out/eval/$name"
done

step "7/7 report: tables and the study plot (one line per lambda)"
"$python" -m pasta.eval "${common[@]}" report="$out/eval/*" output_dir="$out/report"
"$python" scripts/study_plot.py "$out/eval" "$out/report/study.png"

printf '\n== done in %d s. Outputs: %s/ (report: %s/report/, study plot: %s/report/study.png)\n' \
    $((SECONDS - started)) "$out" "$out" "$out"
