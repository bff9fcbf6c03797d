"""The frontend's processes run without torch (frontend/torchless.py): the tokenizer and
chat template they build then must give the ids, texts and prompts that the same directory
gives with torch loaded, and a served group's frontend and gateway must map no libtorch."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest

from frontend.http.chat import ChatTemplate
from frontend.tokenizer import Tokenizer
from scripts import ROOT
from tests.frontend.test_chat_injection import tokenizer_dir

TEXTS = ["Hello world", "  two  spaces\tand a tab\n", "naïve café: 東京 🙂", "<|im_start|>x",
         "def f(x):\n    return x ** 2\n"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🙂"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]

# run in a fresh interpreter that forbids torch first, as `python -m frontend` does
CHILD = """
import json, sys
from frontend.torchless import forbid_torch
forbid_torch()
from frontend.http.chat import ChatTemplate
from frontend.tokenizer import Tokenizer
texts, chat = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {p: facts(Tokenizer.load(p), ChatTemplate.load(p), texts, chat) for p in sys.argv[3:]}
print(json.dumps({"facts": out, "torch": sorted(m for m in sys.modules if m.split(".")[0]
                                                == "torch" and sys.modules[m] is not None)}))
"""


def facts(tok, chat, texts, messages) -> dict:
    """What the frontend and gateway make of `texts` and `messages`."""
    ids = [tok.encode(t) for t in texts]
    prompt = chat.prompt(messages)
    return {"ids": ids, "bare": [tok.encode(t, add_special_tokens=False) for t in texts],
            "text": [tok.decode(i) for i in ids], "all": [tok.decode(i, False) for i in ids],
            "prompt": chat.render(messages), "prompt_ids": chat.ids(prompt)}


NAMES = ["smollm2", "tiny", "smol"]


@pytest.fixture(scope="module")
def torchless() -> dict:
    """What a torchless process makes of each of NAMES' directories (one process for all)."""
    paths = [tokenizer_dir(n) for n in NAMES]
    r = subprocess.run([sys.executable, "-c", inspect.getsource(facts) + CHILD,
                        json.dumps(TEXTS), json.dumps(CHAT), *paths],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PyTorch was not found" not in r.stderr   # an expected absence is not news
    return json.loads(r.stdout)


def test_the_torchless_process_imported_no_torch(torchless):
    assert torchless["torch"] == []


@pytest.mark.parametrize("name", NAMES)
def test_without_torch_the_tokenizer_and_template_are_the_same(torchless, name):
    path = tokenizer_dir(name)
    assert torchless["facts"][path] == facts(Tokenizer.load(path), ChatTemplate.load(path),
                                             TEXTS, CHAT)


def test_forbid_leaves_a_process_that_has_torch_alone():
    code = ("import torch, sys\nfrom frontend.torchless import forbid_torch\nforbid_torch()\n"
            "import torch\nprint(sys.modules['torch'] is not None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.stdout.strip() == "True", r.stderr[-2000:]
