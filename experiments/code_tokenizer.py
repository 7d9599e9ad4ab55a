"""Trains the repository environment's code tokenizer (research/rl/envs/repo/code_tokenizer/).

python -m experiments.code_tokenizer [--vocab_size=1536] [--out=research/rl/envs/repo/code_tokenizer]
    [--repos=experiments/task_repos.txt] [--cache=~/.cache/research-envs] [--workdir=DIR]

A byte-level BPE (Hugging Face `tokenizers`) with ChatML's special tokens, trained on the task
repositories' Python sources and the tool syntax: the sdists of `--repos` (fetched into `--cache`
as launch.make_tasks fetches them; offline once they are there), and the fixture's sources
(research/tasks/testing.py, the default tasks of repo RL) with the oracle's episodes of its tasks
(prompt, calls, observations), weighted to as many characters as the sdists, and env_repo.WORDS,
so the call syntax's words are one token each. Pieces (PATTERN) are words with their underscores,
phrases of words, punctuation runs, a line break alone and `view`'s line numbers. The same inputs
give the same file. Prints tokens per oracle episode for bytes (with and without the words) and for
the tokenizer; docs/rl.md has the numbers of the committed one and the vocabulary sizes tried.
"""
import json
from pathlib import Path
import re
import tempfile

from absl import app, flags
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from research.rl.envs import repo
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo import oracle
from research.rl.envs.repo.settings import Settings
from research.tasks import testing
from research.tasks.factory import sources
from research.tokenizer.base import ByteTokenizer
from research.tokenizer.hf import HFTokenizer

_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 1536, 'Ids in all, special tokens included.')
_OUT = flags.DEFINE_string('out', repo.CODE_TOKENIZER, 'Folder for tokenizer.json and tokenizer_config.json.')
_REPOS = flags.DEFINE_string('repos', 'experiments/task_repos.txt', 'Task repositories (sdists).')
_CACHE = flags.DEFINE_string('cache', str(Path.home() / '.cache/research-envs'), 'Where sdists are kept.')
_WORKDIR = flags.DEFINE_string('workdir', None, "Keep the fixture's tasks here (made once).")

SPECIALS = ('<|endoftext|>', '<|im_start|>', '<|im_end|>')  # <|endoftext|> pads.
CHATML_JINJA = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_WORD = r"""[\p{L}_][\p{L}\p{N}_]*"""          # Identifiers keep their underscores.
_PUNCT = r"""(?:[^\s\p{L}\p{N}_\\]|\\[^nrt])"""  # Punctuation, up to a JSON line break.
PATTERN = '|'.join([
    r""" *\p{N}+\t""",                     # A line number as `view` writes it.
    r"""(?:\\[nrt])+ *""",                 # JSON escapes of line breaks and the indentation after.
    # A line break alone: no piece spans a chat header's last line break and the content, so
    # rendering message by message gives the chat template's ids.
    r"""\r?\n""",
    rf""" *{_WORD}(?: {_WORD})*""",         # A word or a phrase, one space apart, after its indentation.
    r"""\p{N}{1,3}""",
    rf""" *{_PUNCT}+(?: {_PUNCT}+)*""",     # Punctuation, likewise (`", "`).
    r"""\\""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# Each word this often (bare and after a space): enough for a merge of its own.
WORD_REPEATS = 2000
# What varies between runs of the same episode (its temp dir, timings): one spelling each, so the
# same inputs train the same tokenizer.
_VARYING = ((re.compile(r'repo-episode-\w+'), 'repo-episode-0'), (re.compile(r'\d+\.\d+s\b'), '0.01s'))


def repo_sources(repos: str, cache: Path) -> list[str]:
  """The Python files of each repository of the list, in path order."""
  out = []
  for source in sources.read_list(Path(repos)):
    tree = sources.fetch(source, cache)
    out += [p.read_text(errors='replace') for p in sorted(tree.rglob('*.py')) if p.is_file()]
  return out


def episode_texts(convs: list[list[dict]]) -> list[str]:
  """The episodes' messages, what varies between runs spelled one way."""
  out = []
  for conv in convs:
    for m in conv:
      text = m['content']
      for pattern, fixed in _VARYING:
        text = pattern.sub(fixed, text)
      out.append(text)
  return out


def train(texts: list[str], vocab_size: int) -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(PATTERN), behavior='isolated'),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return tok


def write(tok: tokenizers.Tokenizer, out: Path) -> None:
  """tokenizer.json and tokenizer_config.json (eos, pad and the ChatML template), as a checkpoint has them."""
  out.mkdir(parents=True, exist_ok=True)
  tok.save(str(out / 'tokenizer.json'))
  with open(out / 'tokenizer_config.json', 'w') as f:
    json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '<|im_end|>',
               'pad_token': '<|endoftext|>', 'chat_template': CHATML_JINJA}, f, indent=1)
    f.write('\n')


def corpus(env, repos: str, cache: Path) -> list[str]:
  """The training texts: the sdists' sources, the fixture's sources and oracle episodes weighted to
  as many characters (the default tasks of repo RL: RL sees these files and this prompt), the words."""
  general = repo_sources(repos, cache)
  domain = [*testing.FILES.values(), testing.NUMDEP, *episode_texts(oracle.episodes(env))]
  weight = max(1, round(sum(map(len, general)) / sum(map(len, domain))))
  words = [t for w in env_repo.WORDS for t in (w, ' ' + w)]
  return general + domain * weight + words * WORD_REPEATS


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix='code-tokenizer-') as tmp:
    workdir = _WORKDIR.value or tmp
    texts = corpus(env_repo.make(Settings(), workdir), _REPOS.value, Path(_CACHE.value))
    write(train(texts, _VOCAB_SIZE.value), Path(_OUT.value))
    tok = HFTokenizer(_OUT.value)
    long = [w for w in env_repo.WORDS if len(tok.encode(w)) != 1 or len(tok.encode(' ' + w)) != 1]
    if long:
      raise ValueError(f'words that are not one token (raise WORD_REPEATS): {long}')
    print(f'{sum(map(len, texts)) / 1e6:.2f}M characters; vocab_size {tok.vocab_size}')
    for chars in (400, Settings().observation_chars):
      convs = oracle.episodes(env_repo.make(Settings(observation_chars=chars), workdir))
      n = {name: oracle.tokens_per_episode(t, convs) for name, t in (
          ('bytes', ByteTokenizer()), ('bytes+words', ByteTokenizer(env_repo.WORDS)), ('code', tok))}
      print(f'observation_chars={chars}: tokens per episode ' + ', '.join(f'{k} {v:.0f}' for k, v in n.items())
            + f'; bytes+words / code {n["bytes+words"] / n["code"]:.2f}')


if __name__ == '__main__':
  app.run(main)
