"""The chaos soak's own checks (bench/chaos_soak.py), on results built here, with no stack: a chat turn
seen done must be stored as it was streamed, an answer cut by an error must be a prefix of its solo
run, and only errors inside a fault's window are excused."""

from __future__ import annotations

import sqlite3

from bench.chaos_soak import FAULT_WINDOW_S, Faults, Turn, cut_mismatches, stored
from bench.load_clients import Result, Spec
from bench.load_oracle import Solo

GREEDY = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}


def test_a_chat_turn_seen_done_must_be_stored_as_streamed(tmp_path):
    db_path = tmp_path / "db.sqlite3"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE chat_message (id INTEGER PRIMARY KEY, conversation_id INTEGER, role TEXT, "
               "content TEXT, finish_reason TEXT)")
    db.executemany("INSERT INTO chat_message VALUES (?, ?, ?, ?, ?)", [
        (1, 7, "user", "hi", ""), (2, 7, "assistant", "a reply", "length"), (3, 7, "assistant", "cut", "error"),
        (4, 8, "assistant", "elsewhere", "length")])
    db.commit()
    db.close()
    kept = Turn(7, "done", "a reply", "length", 2)
    cut = Turn(7, "done", "cut", "error", 3)
    refused = Turn(7, "error:unavailable")  # never reached the database: nothing to find
    assert stored(db_path, [kept, cut, refused]) == []
    lost = Turn(7, "done", "gone", "length", 9)
    changed = Turn(7, "done", "a reply, and more", "length", 2)
    other_conversation = Turn(7, "done", "elsewhere", "length", 4)
    wrong_ending = Turn(7, "done", "cut", "length", 3)
    assert [t["message_id"] for t in stored(db_path, [kept, lost, changed, other_conversation, wrong_ending])] == \
        [9, 2, 4, 3]


def test_an_answer_cut_by_an_error_must_be_a_prefix_of_its_solo_run():
    want = {0: Solo([1, 2, 3, 4], "a b c d", [0, 1, 3, 5])}

    def errored(api: str, tokens: list[int], text: str) -> Result:
        return Result(Spec(0, api, "u", "p", GREEDY, "read", 1), ending="error:worker_lost", text=text,
                      token_ids=tokens)

    assert cut_mismatches([errored("ws", [1, 2], "a b"), errored("openai", [], "a b c")], want) == []
    assert cut_mismatches([errored("ws", [1, 3], "a c")], want) == [0]
    assert cut_mismatches([errored("openai", [], "a c")], want) == [0]
    done = Result(Spec(0, "ws", "u", "p", GREEDY, "read", 1), ending="done", token_ids=[9])
    assert cut_mismatches([done], want) == [], "a done answer is the oracle's to judge, not this check's"


def test_only_an_error_within_a_faults_window_is_excused():
    faults = Faults([("worker SIGKILLed", 10.0, 20.0)])
    assert [faults.covers(at) for at in (9.9, 10.0, 20.0 + FAULT_WINDOW_S, 20.1 + FAULT_WINDOW_S)] == \
        [False, True, True, False]
