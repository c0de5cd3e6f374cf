"""The executors' launch plans by step shape (radiance/engine/running/executor.py ShapePlans): a
server's steps keep making new shapes (arrivals, prefill chunks beside the decodes, finished
requests); past the limit the plan used longest ago goes, never the hot decode shape's."""

from collections import Counter

from radiance.engine.running.executor import ShapePlans


def test_new_step_shapes_drop_the_coldest_plan_not_the_hot_ones():
    plans, builds = ShapePlans(limit=4), Counter()

    def build(key):
        return lambda: (builds.update([key]), f"plan {key}")[1]

    for step in range(20):  # a decode shape every step, a new mixed shape beside it
        assert plans.get((1, 1), build((1, 1))) == "plan (1, 1)"
        assert plans.get((10 + step, 2), build((10 + step, 2))) == f"plan {(10 + step, 2)}"
    assert builds[(1, 1)] == 1 and len(plans) == 4 and plans.built == 21
    plans.get((29, 2), build((29, 2)))  # among the last four: kept
    plans.get((10, 2), build((10, 2)))  # the first mixed shape went long ago: built again
    assert builds[(29, 2)] == 1 and builds[(10, 2)] == 2 and len(plans) == 4

