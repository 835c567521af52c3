"""Request.token_ids: positions of prompt + output without the concatenation."""

from hypothesis import given
from hypothesis import strategies as st

from localchat.engine.request import Request
from localchat.engine.sampling_params import SamplingParams


@given(st.lists(st.integers(0, 99), min_size=1, max_size=20),
       st.lists(st.integers(0, 99), max_size=20), st.data())
def test_token_ids_equals_the_slice_of_the_concatenation(prompt, output, data):
    req = Request("r", prompt, SamplingParams())
    req.output_token_ids = list(output)
    n = len(prompt) + len(output)
    start = data.draw(st.integers(0, n))
    end = data.draw(st.integers(start, n))
    assert req.token_ids(start, end) == (prompt + output)[start:end]
