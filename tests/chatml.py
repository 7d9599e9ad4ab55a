"""A small BPE tokenizer with the ChatML template, trained here (no hub), for tests that need one."""

import json

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
CHATML_JINJA = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _corpus(n=300, seed=0):
  rng = np.random.RandomState(seed)
  words = ['def', 'return', 'assert', 'import', 'class', 'self', 'test', 'value', 'print', 'for',
           'in', 'range', 'if', 'else', 'None', 'True', 'x', 'y', '(', ')', ':', '=', '+', '-']
  return [' '.join(rng.choice(words, 12)) + '\n    ' + ' '.join(rng.choice(words, 6)) for _ in range(n)]


def tokenizer_folder(path, vocab_size: int = 400):
  """Writes tokenizer.json and tokenizer_config.json (ChatML) to `path`; returns it."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  path.mkdir(parents=True, exist_ok=True)
  tok.save(str(path / 'tokenizer.json'))
  with open(path / 'tokenizer_config.json', 'w') as f:
    json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '<|im_end|>',
               'pad_token': '<|endoftext|>', 'chat_template': CHATML_JINJA}, f)
  return path
