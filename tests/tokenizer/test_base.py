"""The byte tokenizer and its optional whole-word tokens."""

import pytest

from research.rl.envs import toolcalc as env_toolcalc
from research.tokenizer import chat
from research.tokenizer.base import ByteTokenizer


def test_words_are_single_ids_only_as_whole_words():
  tok = ByteTokenizer(('add', 'plus', 'ans'))
  assert tok.vocab_size == ByteTokenizer().vocab_size + 3
  text = 'tools +:plus\nplus(3,4) addx xadd ans(7) é'
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert ids.count(tok.word_ids['plus']) == 2 and tok.word_ids['add'] not in ids  # addx, xadd: bytes.
  assert ids[ids.index(tok.word_ids['ans']) + 1] == ord('(')
  assert ByteTokenizer().encode(text) == list(text.encode())  # No words: plain bytes.


def test_longest_word_wins_and_specials_stay_out_of_text():
  tok = ByteTokenizer(('sum', 'summary'))
  assert tok.encode('summary sum') == [tok.word_ids['summary'], ord(' '), tok.word_ids['sum']]
  assert tok.decode([tok.bos_id, tok.word_ids['sum'], tok.end_of_message_id]) == 'sum'


def test_bad_words_are_rejected():
  with pytest.raises(ValueError, match='word characters'):
    ByteTokenizer(('add', 'a b'))


def test_toolcalc_calls_are_one_token_per_name():
  tok = ByteTokenizer(env_toolcalc.WORDS)
  ids, _ = chat.render(tok, [{'role': 'assistant', 'content': 'plus(3,4)'}])
  body = ids[ids.index(tok.role_ids['assistant']) + 1:-1]
  assert body == [tok.word_ids['plus'], *b'(3,4)']
