"""The safetensors writer's arguments: shard sizes, header metadata and where it writes."""

import pytest

from objckpt import errors
from objckpt._formats import safetensors_write as sw


@pytest.mark.parametrize("value, size", [
    (None, None), (1000, 1000), ("5GB", 5 * 10**9), ("2GiB", 2 * 2**30), (" 7 kb ", 7000),
    ("12", 12),
])
def test_shard_size_in_bytes(value, size):
    assert sw.shard_size(value, "out") == size


@pytest.mark.parametrize("value", [0, -1, True, "5 parsecs", 1.5])
def test_a_bad_shard_size_names_the_fix(value):
    with pytest.raises(errors.InvalidArgumentError, match="max_shard_size='5GB'") as info:
        sw.shard_size(value, "out")
    assert f"max_shard_size={value!r}" in str(info.value)


def test_header_metadata_starts_with_the_format_hugging_face_requires():
    assert sw.header_metadata(None, "out") == {"format": "pt"}
    assert sw.header_metadata({"step": "3", "format": "np"}, "out") == {
        "format": "np", "step": "3"}
    with pytest.raises(errors.InvalidArgumentError, match=r"metadata=\{'step': 3\}"):
        sw.header_metadata({"step": 3}, "out")


def test_layout_of_a_file_a_folder_an_index_and_a_url(tmp_path):
    assert sw.layout(str(tmp_path / "w.safetensors")) == (str(tmp_path), "w")
    assert sw.layout(str(tmp_path / "out")) == (str(tmp_path / "out"), "model")
    with pytest.raises(errors.InvalidArgumentError, match="names the index"):
        sw.layout(str(tmp_path / "model.safetensors.index.json"))
    with pytest.raises(errors.InvalidArgumentError, match="is a URL"):
        sw.layout("s3://bucket/model.safetensors")
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(errors.InvalidArgumentError, match="is a directory"):
        sw.layout(str(tmp_path / "d.safetensors"))
