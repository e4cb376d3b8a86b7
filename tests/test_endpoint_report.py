"""What an endpoint bundle's README says of its prompts beside the records: which sessions share a prefix, as the
server tokenized them."""

from __future__ import annotations

from meshbench.results.endpoint_report import SHARED_MIN, shared_prefixes


def test_sessions_sharing_a_system_prompt_are_grouped_with_the_run_each_group_shares():
    system_a, system_b = list(range(100, 100 + 40)), list(range(500, 500 + 24))
    prompts = [system_a + [1, 2], system_a + [3], system_a + [1, 9, 9], system_b + [7], system_b + [8], [5] * 30]
    assert shared_prefixes(prompts) == (
        "; 5 of them in 2 group(s) of 3, 2, each group's prompts beginning with the same 24-40 tokens"
    )


def test_nothing_is_said_where_no_two_prompts_share_enough_ids_or_none_were_recorded():
    short = [1] * (SHARED_MIN - 1)
    assert shared_prefixes(None) == shared_prefixes([]) == shared_prefixes([short, short]) == ""
    assert shared_prefixes([[1] * 40]) == ""  # (one session shares nothing)
    assert shared_prefixes([[1] * 40, [2] * 40]) == ""
