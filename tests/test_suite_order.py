"""The suite's own schedule (``conftest.HEAVY_FIRST``): the files of long tests are handed out
first, so CI's two workers finish together instead of one running them alone at the end."""
import pathlib

from conftest import HEAVY_FIRST, _heavy_first


class _Item:
    def __init__(self, name, k):
        self.path = pathlib.Path("tests") / name
        self.k = k


def test_heavy_files_come_first_then_the_rest_by_size_each_files_tests_in_order():
    items = [_Item("test_a.py", 0), _Item("test_b.py", 1), _Item("test_b.py", 2), _Item("test_rolling.py", 3),
             _Item("test_scan.py", 4), _Item("test_rolling.py", 5)]
    _heavy_first(items)
    assert [(i.path.name, i.k) for i in items] == [("test_rolling.py", 3), ("test_rolling.py", 5), ("test_scan.py", 4),
                                                   ("test_b.py", 1), ("test_b.py", 2), ("test_a.py", 0)]


def test_every_heavy_file_named_exists():
    here = pathlib.Path(__file__).parent
    assert [n for n in HEAVY_FIRST if not (here / n).exists()] == []
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
