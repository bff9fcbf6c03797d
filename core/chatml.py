"""The ChatML chat template (jinja), in one place: the presets' tokenizers ship it
(worker/preset_tokenizer.py) and the gateway falls back to it for a tokenizer without a
template of its own (frontend/http/chat.py). A plain string, so both import it for free."""

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
