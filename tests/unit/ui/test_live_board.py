"""The board between a run and the page's follower (ghostedit/ui/live_board.py): the follower shows the run's views
in order and its last view last, even when it comes after the run ended; a run without a follower (an API call)
leaves nothing behind; a follower closed early cancels its run; /cancel reaches only a run in flight; and a live
view through the follower costs Gradio a fraction of one through the edit's own outputs."""
import asyncio

from ghostedit.ui.live_board import LiveBoard


async def _follow(board: LiveBoard, session: str, limit: int | None = None) -> list:
    shown = []
    follower = board.follow(session)
    async for view in follower:
        shown.append(view)
        if limit is not None and len(shown) == limit:
            await follower.aclose()  # the page was closed
            break
    return shown


def test_the_follower_shows_every_view_in_order_and_ends_with_the_run():
    board = LiveBoard()
    views = [(f"step {step}", {"step": step}) for step in range(30)]

    async def scenario():
        with board.running("tab") as run:
            run.await_follower()
            follower = asyncio.create_task(_follow(board, "tab"))

            def work():
                for view in views:
                    run.show(view)
            await asyncio.to_thread(work)
            run.show(("done", {"state": "done"}))  # the answer's words come last
        return await follower

    shown = asyncio.run(scenario())
    assert shown[-1] == ("done", {"state": "done"})
    indices = [views.index(view) for view in shown[:-1]]
    assert indices == sorted(indices)  # newer views only (a quick run may skip some), never an older one
    assert not board.cancel("tab")  # nothing left in flight


def test_a_follower_that_comes_after_the_run_ended_shows_its_last_view_only():
    board = LiveBoard()
    with board.running("tab") as run:
        run.await_follower()
        run.show(("starting", {}))
        run.show(("done", {"state": "done"}))
    assert asyncio.run(_follow(board, "tab")) == [("done", {"state": "done"})]
    assert asyncio.run(_follow(board, "tab")) == []  # taken off the board by the follower that came


def test_an_ended_run_whose_follower_never_came_is_dropped_at_a_later_run(monkeypatch):
    from ghostedit.ui import live_board
    board = LiveBoard()
    with board.running("closed tab") as run:
        run.await_follower()
        run.show(("done", {}))
    with board.running("another tab"):
        pass
    assert board._runs.keys() == {"closed tab"}  # within the wait: kept for its follower
    monkeypatch.setattr(live_board, "FOLLOWER_WAIT_S", 0.0)
    with board.running("another tab"):
        pass
    assert asyncio.run(_follow(board, "closed tab")) == []


def test_a_run_no_follower_was_called_for_leaves_nothing_and_a_later_follower_shows_nothing():
    board = LiveBoard()
    with board.running("api") as run:
        cancel = board.switch("api")
        assert cancel is run.cancel and board.cancel("api") and cancel.is_set()
    assert not board.cancel("api")
    assert asyncio.run(_follow(board, "api")) == []


def test_a_follower_closed_before_its_run_ended_cancels_it():
    board = LiveBoard()

    async def scenario():
        with board.running("tab") as run:
            run.await_follower()
            run.show(("step 1", {}))
            shown = await _follow(board, "tab", limit=1)
            return shown, run.cancel.is_set()

    shown, cancelled = asyncio.run(scenario())
    assert shown == [("step 1", {})] and cancelled


def test_a_second_follower_of_one_run_shows_nothing():
    board = LiveBoard()

    async def scenario():
        with board.running("tab") as run:
            run.await_follower()
            first = asyncio.create_task(_follow(board, "tab"))
            await asyncio.sleep(0.01)
            second = await _follow(board, "tab")
            run.show(("done", {}))
        return await first, second

    first, second = asyncio.run(scenario())
    assert first == [("done", {})] and second == []


def test_a_live_view_costs_gradio_a_fraction_of_one_through_the_edit_s_outputs(tmp_path):
    """On the page's real Blocks: Gradio's post-processing of a follower's view (the status and the run's JSON)
    against a view sent through the edit event's own outputs, which leaves the slider, table and gallery as they
    are (gr.skip(): Gradio builds each anew with its API schema)."""
    import time

    import gradio as gr
    from gradio.state_holder import SessionState

    from ghostedit.ui import create_app
    demo = create_app("tiny", tmp_path / "loras", device="cpu", warm_up=[])
    follower = next(fn for fn in demo.fns.values() if fn.name == "follow")
    page_edit = next(fn for fn in demo.fns.values() if fn.name == "edit" and fn.api_visibility == "private")
    assert [type(block).__name__ for block in follower.outputs] == ["Markdown", "JSON"]
    view = ("### ⏳ Denoising · step 3/40", {"state": "running", "step": 3})
    skip = gr.skip()

    def cost_ms(fn, outputs) -> float:
        """The CPU time of one update (the process's, its threads' too), the least of 20: waits for a thread on a
        loaded machine are not the update's cost."""
        state = SessionState(demo)
        seconds = []
        for _ in range(20):
            began = time.process_time()
            asyncio.run(demo.postprocess_data(fn, list(outputs), state))
            seconds.append(time.process_time() - began)
        return 1000 * min(seconds)

    through_follower = cost_ms(follower, view)
    through_edit = cost_ms(page_edit, (view[0], skip, skip, view[1], skip, skip, skip, skip))
    assert through_follower < 5 and through_follower < through_edit / 4, (through_follower, through_edit)
