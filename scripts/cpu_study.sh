#!/usr/bin/env bash
# The CPU study: does PASTA buy a user wall-clock time at equal quality, on prompts no stage trained on?
#   annotate the shared 5K Alpaca (structural teacher) -> SFT with the stage defaults -> Baseline-SFT (same records,
#   tags stripped) -> Baseline-SFT decoded on the held-out prompts -> a lambda sweep x rounds of the preference stage,
#   each lambda chained from the SFT model, scored against Baseline-SFT's own answers (stage.reference=baseline: the
#   latency speed reward counts a candidate's steps against them) -> every PASTA model decoded on the same held-out
#   prompts -> the report table and the study plot (speedup vs the embedding-similarity proxy, one line per lambda).
# Every step resumes: rerun the same command after a kill and finished work is skipped (training from its last
# checkpoint, a sweep between rounds without redoing a round, evaluation from the last decoded prompt). Round 1
# samples the same candidates for every lambda (same start, prompts and seeds), so later lambdas reuse the first
# lambda's round-1 samples and Baseline-SFT answers instead of decoding them again.
#
# Every answer gets the same budget: max_new_tokens tokens, every thread's together for the PASTA models
# (decode.max_total_tokens), as a sequential answer's. Otherwise a PASTA answer may run to max_new_tokens on its main
# thread and as many again in each chunk.
#
# How speed is measured: every model decodes the held-out prompts in batches (eval.timing=throughput) except the
# first PASTA_STUDY_TIMED_PROMPTS, decoded one at a time after a warm-up: their per-prompt wall-clock speedups against
# Baseline-SFT are measured. For every prompt, the cost model prices each answer's steps on the forward cost by rows
# measured in Baseline-SFT's run (c(q), step_costs.json): the cost-model speedup, beside the measured one.
#
#   scripts/cpu_study.sh                                  # outputs/study/, the embedded SmolLM2-135M
#   PASTA_STUDY_DIR=/tmp/s PASTA_STUDY_LAMBDAS="1 inf" scripts/cpu_study.sh
#
# Sizes come from the environment (the test suite runs this script on a tiny random model). The quality numbers are
# offline proxies (embedding similarity to AlpacaEval's GPT-4 Turbo answers, distinct-n, length ratio), labelled as
# such; the embedded 135M judge's win rate is left out (in the 2026-11-24 study it read 49.7-50.5 for every model).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PASTA_VENV:-.venv}/bin/python
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
out=${PASTA_STUDY_DIR:-outputs/study}
model=${PASTA_STUDY_MODEL:-smollm2-135m}
data=${PASTA_STUDY_DATA:-alpaca_eval_gpt4_mix}        # conf/data/: the records the teacher annotates (alpaca_5k: the old study)
eval_data=${PASTA_STUDY_EVAL_DATA:-alpaca_eval}       # conf/eval_data/: the held-out prompts
num_records=${PASTA_STUDY_RECORDS:-null}              # records annotated (null = all)
sft_args=${PASTA_STUDY_SFT_ARGS:-}                    # extra SFT overrides, e.g. "stage.max_steps=200"
lambdas=${PASTA_STUDY_LAMBDAS:-1 4 inf}               # stage.quality_weight of each sweep line
num_rounds=${PASTA_STUDY_ROUNDS:-2}
num_prompts=${PASTA_STUDY_PREF_PROMPTS:-32}           # preference prompts per round (N samples each)
num_samples=${PASTA_STUDY_SAMPLES:-4}
pref_args=${PASTA_STUDY_PREF_ARGS:-}                  # extra preference overrides
num_eval=${PASTA_STUDY_EVAL_PROMPTS:-100}             # held-out prompts (eval.subset, seed 0)
num_timed=${PASTA_STUDY_TIMED_PROMPTS:-20}            # of them, decoded one at a time (measured wall clock)
max_new_tokens=${PASTA_STUDY_MAX_NEW_TOKENS:-256}

common=("paths.output_root=$out" device=cpu "model=$model")
# shellcheck disable=SC2206  # the extra overrides are meant to split on spaces
train=("${common[@]}" "data.path=$out/annotated.jsonl" resume=true)
evaluate=("${common[@]}" "eval_data=$eval_data" "eval.subset=$num_eval" eval.subset_seed=0
    "decode.max_new_tokens=$max_new_tokens" "decode.max_total_tokens=$max_new_tokens" eval.timing=throughput \
    eval.batch_size=8 "eval.timed_prompts=$num_timed"
    eval.win_rate=false)
baseline_eval="$out/eval/baseline-sft"
started=$SECONDS
step() { printf '\n== [%4d s] %s\n' $((SECONDS - started)) "$*"; }
done_already() { [ -f "$1/final/config.json" ] && echo "   already done: $1/final"; }
# Run names say lambda and round; "inf" and "1.0" are fine in a folder name.
pref_dir() { echo "$out/pref-lambda$1"; }

step "1/7 prepare the model (converted once into the cache)"
"$python" -m pasta.models prepare

step "2/7 annotate $data with the structural teacher (rule-based, no model)"
"$python" -m pasta.annotate "${common[@]}" teacher=structural "data=$data" "data.limit=$num_records" \
    on_reject=keep_unannotated output="$out/annotated.jsonl"

step "3/7 SFT with the stage defaults (only the promise-bearing records when they are scarce, as the stage logs)"
# shellcheck disable=SC2086
done_already "$out/sft" || "$python" -m pasta.train stage=sft "${train[@]}" output_dir="$out/sft" $sft_args

step "4/7 Baseline-SFT: the same records with the tags stripped"
# shellcheck disable=SC2086
done_already "$out/baseline-sft" || "$python" -m pasta.train stage=sft "${train[@]}" data.strip_annotations=true \
    output_dir="$out/baseline-sft" $sft_args

step "5/7 decode Baseline-SFT on the $num_eval held-out $eval_data prompts (sequential)"
"$python" -m pasta.eval "${evaluate[@]}" model.path="$out/baseline-sft/final" decode=sequential \
    eval.generator=baseline-sft output_dir="$baseline_eval"

step "6/7 preference: lambda in {$lambdas} x $num_rounds rounds, each lambda from the SFT model"
first=""
for lambda in $lambdas; do
    dir=$(pref_dir "$lambda")
    if done_already "$dir/round-$num_rounds"; then first=${first:-$dir}; continue; fi
    if [ -n "$first" ]; then  # the same round-1 candidates and Baseline-SFT answers: reuse, do not decode again
        mkdir -p "$dir/round-1"
        for shared in baseline_answers.jsonl round-1/scores.jsonl; do
            [ -f "$dir/$shared" ] || [ ! -f "$first/$shared" ] || cp "$first/$shared" "$dir/$shared"
        done
    fi
    # shellcheck disable=SC2086
    "$python" -m pasta.train stage=pref "${train[@]}" model.path="$out/sft/final" "stage.quality_weight=$lambda" \
        "stage.rounds=$num_rounds" "stage.prompts_per_round=$num_prompts" "stage.num_samples=$num_samples" \
        "stage.max_new_tokens=$max_new_tokens" stage.reference=baseline \
        stage.baseline_model="$out/baseline-sft/final" output_dir="$dir" $pref_args
    first=${first:-$dir}
done

runs=("sft:$out/sft/final")
for lambda in $lambdas; do
    for round in $(seq 1 "$num_rounds"); do
        runs+=("lambda$lambda-round$round:$(pref_dir "$lambda")/round-$round/final")
    done
done
for run in "${runs[@]}"; do
    name=pasta-${run%%:*}
    step "   decode $name on the same prompts"
    "$python" -m pasta.eval "${evaluate[@]}" model.path="${run#*:}" decode=async \
        eval.reference="$baseline_eval" eval.sequential="$baseline_eval" \
        eval.generator="$name" output_dir="$out/eval/$name"
done

step "7/7 report: tables and the study plot (one line per lambda)"
"$python" -m pasta.eval "${common[@]}" report="$out/eval/*" output_dir="$out/report"
"$python" scripts/study_plot.py "$out/eval" "$out/report/study.png"

printf '\n== done in %d s. Outputs: %s/ (report: %s/report/, study plot: %s/report/study.png)\n' \
    $((SECONDS - started)) "$out" "$out" "$out"
