"""The model side of training: tag tokens, LoRA (with trainable tag rows) or full finetuning, and the final folder.

Final folder (`<output_dir>/final`): loadable with `AutoModelForCausalLM.from_pretrained` and by `pasta.models`
through `model.path=...`, tokenizer (tag tokens included) alongside.
- LoRA, `merge_lora=true` (default) and full finetuning: a plain model folder.
- LoRA, `merge_lora=false`: the adapter, whose `base_model_name_or_path` is `<output_dir>/base`, the starting model
  with its tag-token rows added (a base without them cannot take the adapter), saved once before training.
The folder is written beside its place and renamed into it, so a crash never leaves half a model behind.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from pasta.lang import ReservationPolicy
from pasta.lang.tokens import TagIds
from pasta.models.trained_lang import write_trained_policy
from pasta.training.config import Finetune, LoraSettings, OptimSettings

log = logging.getLogger(__name__)


def _module_name(model, module) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name.rsplit(".", 1)[-1]
    raise ValueError("module not found in model")


def lora_config(lora: LoraSettings, model, tag_ids: TagIds):
    """peft LoraConfig: adapters on `target_modules` plus trainable rows for the tag tokens.

    The tag tokens are new, so their embedding rows (and, for an untied LM head, their output rows) must train,
    or the model cannot learn to read or emit them; peft's trainable tokens train just those rows rather than the
    whole vocabulary (`modules_to_save`). With tied embeddings peft shares the rows with the LM head.
    """
    from peft import LoraConfig

    indices = sorted(tag_ids.all)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    trainable = {_module_name(model, embed): indices}
    if head is not None and head.weight.data_ptr() != embed.weight.data_ptr():
        trainable[_module_name(model, head)] = indices
    target = lora.target_modules
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        trainable_token_indices=trainable,
        task_type="CAUSAL_LM",
    )


def expose_head_bias(model) -> None:
    """Let TRL's fused LM head read `lm_head.bias` through peft's trainable-token wrapper.

    peft's TrainableTokensWrapper forwards `.weight` (with the trained rows merged in) to the head it wraps, but
    not `.bias`, which the fused head reads (AttributeError). The bias is put in the wrapper's `__dict__`, not
    registered: it stays the wrapped head's own parameter (None for the Llama-family heads we train).
    """
    from peft.utils.other import TrainableTokensWrapper

    head = model.get_output_embeddings()
    if isinstance(head, TrainableTokensWrapper) and "bias" not in vars(head):
        vars(head)["bias"] = head.token_adapter.base_layer.bias


def save_model_folder(model, tokenizer, target: Path, policy: ReservationPolicy | None = None) -> Path:
    """Save model and tokenizer, and the reservation `policy` it was trained with (None: none recorded), into
    `target` through a temporary sibling folder and a rename: the folder appears whole or not at all."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if policy is not None:
            write_trained_policy(tmp, policy)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_base_once(model, tokenizer, target: Path) -> None:
    """Save the starting model (tag rows added) as the adapter's base: by the main process, before PEFT wraps it."""
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process and not (Path(target) / "config.json").is_file():
        save_model_folder(model, tokenizer, target)
    state.wait_for_everyone()


def save_final(trainer, tokenizer, settings: OptimSettings, output_dir: Path,
               policy: ReservationPolicy | None = None) -> Path:
    """Write `<output_dir>/final` from a trained TRL trainer (every process calls this; see the module docstring),
    with the reservation `policy` the checkpoint was trained with (pasta.models.trained_lang; None for Baseline-SFT,
    which writes no promise).

    Under FSDP or DeepSpeed the weights are sharded over the processes, so transformers' `save_model` gathers
    them (all processes take part) into a temporary folder that the main process renames into place; an adapter
    is saved as is there (merging needs the full weights: `merge_lora=false` is required and checked up front).
    Otherwise the main process merges (LoRA) and saves the unwrapped model.
    """
    from peft import PeftModel

    output_dir = Path(output_dir)
    final = output_dir / "final"
    model = trainer.accelerator.unwrap_model(trainer.model)
    if isinstance(model, PeftModel) and not settings.merge_lora:
        model.peft_config["default"].base_model_name_or_path = str((output_dir / "base").resolve())
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        gathered = output_dir / ".final.gathered"
        trainer.save_model(str(gathered))
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(gathered)
            if policy is not None:
                write_trained_policy(gathered, policy)
            if final.exists():
                shutil.rmtree(final)
            gathered.rename(final)
    elif trainer.is_world_process_zero():
        if isinstance(model, PeftModel) and settings.merge_lora:
            model = model.merge_and_unload()
        save_model_folder(model, tokenizer, final, policy)
    trainer.accelerator.wait_for_everyone()
    return final


def check_sharding(trainer, settings: OptimSettings) -> None:
    """Refuse a LoRA merge under FSDP/DeepSpeed before training rather than after it."""
    from pasta.errors import PastaError

    sharded = trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled
    if sharded and settings.finetune == Finetune.lora and settings.merge_lora:
        raise PastaError("LoRA under FSDP/DeepSpeed saves the adapter only: set stage.merge_lora=false")

