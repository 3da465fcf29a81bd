#!/usr/bin/env bash
# The CPU study (issue 13): does the preference stage buy speed at equal quality, on prompts no stage trained on?
#   annotate the shared 5K Alpaca (structural teacher) -> SFT with the stage defaults -> Baseline-SFT (same records,
#   tags stripped) -> a lambda sweep x rounds of the preference stage, each lambda chained from the SFT model ->
#   every model decoded on the same seeded subset of AlpacaEval (Baseline-SFT sequentially, batch 1; the PASTA
#   models asynchronously) -> the report table and the study plot (speedup vs the embedding-similarity proxy, one
#   line per lambda across rounds).
# Every step resumes: rerun the same command after a kill and finished work is skipped (training from its last
# checkpoint, a sweep between rounds without redoing a round, evaluation from the last decoded prompt).
#
#   scripts/cpu_study.sh                                  # outputs/study/, the embedded SmolLM2-135M
#   PASTA_STUDY_DIR=/tmp/s PASTA_STUDY_LAMBDAS="1 inf" scripts/cpu_study.sh
#
# Sizes come from the environment (the test suite runs this script on a tiny random model). The quality numbers are
# offline proxies (embedding similarity to AlpacaEval's GPT-4 Turbo answers, distinct-n, length ratio) plus the
# pairwise win rate of the embedded 135M judge against Baseline-SFT: labelled as such, not the paper's GPT-4 judge.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PASTA_VENV:-.venv}/bin/python
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
out=${PASTA_STUDY_DIR:-outputs/study}
model=${PASTA_STUDY_MODEL:-smollm2-135m}
data=${PASTA_STUDY_DATA:-alpaca_5k}                   # conf/data/: the records the teacher annotates
eval_data=${PASTA_STUDY_EVAL_DATA:-alpaca_eval}       # conf/eval_data/: the held-out prompts
num_records=${PASTA_STUDY_RECORDS:-null}              # records annotated (null = all)
sft_args=${PASTA_STUDY_SFT_ARGS:-}                    # extra SFT overrides, e.g. "stage.max_steps=200"
lambdas=${PASTA_STUDY_LAMBDAS:-1 4 inf}               # stage.quality_weight of each sweep line
num_rounds=${PASTA_STUDY_ROUNDS:-2}
num_prompts=${PASTA_STUDY_PREF_PROMPTS:-32}           # preference prompts per round (N samples each)
num_samples=${PASTA_STUDY_SAMPLES:-4}
pref_args=${PASTA_STUDY_PREF_ARGS:-}                  # extra preference overrides
num_eval=${PASTA_STUDY_EVAL_PROMPTS:-100}             # held-out prompts (eval.subset, seed 0)
max_new_tokens=${PASTA_STUDY_MAX_NEW_TOKENS:-256}

common=("paths.output_root=$out" device=cpu "model=$model")
# shellcheck disable=SC2206  # the extra overrides are meant to split on spaces
train=("${common[@]}" "data.path=$out/annotated.jsonl" resume=true)
evaluate=("${common[@]}" "eval_data=$eval_data" "eval.subset=$num_eval" eval.subset_seed=0
    "decode.max_new_tokens=$max_new_tokens" "model@judge.model=$model")
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

step "5/7 preference: lambda in {$lambdas} x $num_rounds rounds, each lambda from the SFT model"
for lambda in $lambdas; do
    dir=$(pref_dir "$lambda")
    if done_already "$dir/round-$num_rounds"; then continue; fi
    # shellcheck disable=SC2086
    "$python" -m pasta.train stage=pref "${train[@]}" model.path="$out/sft/final" "stage.quality_weight=$lambda" \
        "stage.rounds=$num_rounds" "stage.prompts_per_round=$num_prompts" "stage.num_samples=$num_samples" \
        "stage.max_new_tokens=$max_new_tokens" output_dir="$dir" $pref_args
done

step "6/7 decode every model on the same $num_eval held-out $eval_data prompts"
"$python" -m pasta.eval "${evaluate[@]}" model.path="$out/baseline-sft/final" decode=sequential \
    eval.generator=baseline-sft output_dir="$out/eval/baseline-sft"
runs=("sft:$out/sft/final")
for lambda in $lambdas; do
    for round in $(seq 1 "$num_rounds"); do
        runs+=("lambda$lambda-round$round:$(pref_dir "$lambda")/round-$round/final")
    done
done
for run in "${runs[@]}"; do
    name=pasta-${run%%:*}
    "$python" -m pasta.eval "${evaluate[@]}" model.path="${run#*:}" decode=async \
        eval.reference="$out/eval/baseline-sft" eval.sequential="$out/eval/baseline-sft" \
        eval.generator="$name" output_dir="$out/eval/$name"
done

step "7/7 report: tables, the speedup-vs-win-rate plot, and the study plot (one line per lambda)"
"$python" -m pasta.eval "${common[@]}" report="$out/eval/*" output_dir="$out/report"
"$python" scripts/study_plot.py "$out/eval" "$out/report/study.png"

printf '\n== done in %d s. Outputs: %s/ (report: %s/report/, study plot: %s/report/study.png)\n' \
    $((SECONDS - started)) "$out" "$out" "$out"
