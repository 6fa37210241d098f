"""assistgen web app: baseline and assisted generation side by side. Layout and wiring only; the work is in assistgen/."""
from __future__ import annotations

import contextlib
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from gradio_client.utils import is_http_url_like  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from assistgen.config import from_env  # noqa: E402
from assistgen.models.catalog import CatalogError, load_catalog  # noqa: E402
from assistgen.models.limits import limit_threads_to_usable_cpus  # noqa: E402
from assistgen.choices import (DRAFT_SOURCES, MAX_NEW_TOKENS_RANGE, SCHEDULE_NAMES, TASK_LABELS,  # noqa: E402
                               TEMPERATURE_RANGE, TOP_P_RANGE, WINDOW_RANGE, limits_from_env)
from assistgen.app.explore import DEFAULT_MAX_NEW_TOKENS, default_values, explore, explore_outputs  # noqa: E402
from assistgen.app.explore import StopSwitches, progress_html  # noqa: E402
from assistgen.app.body_limit import BodyLimit, body_limit_bytes  # noqa: E402
from assistgen.app.frontend import EarlyScript  # noqa: E402
from assistgen.app import gradio_compat  # noqa: E402
from assistgen.app.render import CLEARED, CSS, LEGEND, STOPPED, LiveView  # noqa: E402
from assistgen.app.render import result_outputs as result_outputs_of  # noqa: E402
from assistgen.app.service import Service  # noqa: E402
from assistgen.app.streaming import IDLE_S, keep_closable  # noqa: E402
from assistgen.app.validation import USER_ERRORS  # noqa: E402
from assistgen.app import zerogpu  # noqa: E402
from assistgen.comparison.audio import duration_text  # noqa: E402
from assistgen.comparison.speech import spoken_language_choices  # noqa: E402
from assistgen.comparison.sweep import OVER  # noqa: E402
from assistgen.comparison.tasks import LANGUAGES  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
gradio_compat.require(gradio_compat.AUDIO_URLS)   # the patch below is written for one Gradio: another stops here


def refuse_audio_urls() -> None:
    """Every gr.Audio of this server takes files only: a URL sent through the API is refused before anything is
    fetched (Gradio would download it whole, past the file-size limit, which covers uploads). Set on the class, since
    Gradio serves a session a fresh copy of a component that an event has updated (a subclass would have Gradio
    write a stub file beside this one)."""
    move = gr.Audio.async_move_resource_to_block_cache
    if getattr(move, "refuses_urls", False):
        return

    async def files_only(self, url_or_file_path):
        if is_http_url_like(str(url_or_file_path or "")):
            raise gr.Error("this server does not fetch audio from URLs: send the file itself (gradio_client: "
                           "handle_file with a local path)")
        return await move(self, url_or_file_path)
    files_only.refuses_urls = True
    gr.Audio.async_move_resource_to_block_cache = files_only

# shown under a pair when picking it, or its tab, has set the shared Settings to the pair's own defaults
SETTINGS_RESET = ("\n\n*Settings set to this pair's own defaults (max new tokens, draft source, window, schedule): "
                  "they are what was measured best for it.*")
INTRO = """# assistgen: assisted generation, side by side
A small **assistant** model drafts a few tokens; the large **target** model checks them all in **one** forward pass,
keeps the longest agreeing prefix plus its own next token. Generation is bound by memory bandwidth, so fewer target
passes means lower latency, with output **identical** to greedy decoding. Pick a task and a pair, then press *Run*:
the baseline runs first, then assisted generation, and both stream below."""

EXAMPLES = {
    "chat": [["Write a Python function that returns the n-th Fibonacci number, with a docstring and type hints."],
             ["Complete this code and explain it briefly:\n\ndef is_palindrome(s: str) -> bool:\n    \"\"\"Return True "
              "if s reads the same forwards and backwards, ignoring case and non-alphanumeric characters.\"\"\""],
             ["What is speculative decoding? Answer in three sentences."]],
    "translation": [["The quick brown fox jumps over the lazy dog.", "French"],
                    ["Assisted generation makes large language models faster without changing their output.",
                     "German"]],
    "summarization": [["Speculative decoding speeds up inference of large language models. A small draft model "
                       "proposes several tokens, and the large model verifies them in a single forward pass. Tokens "
                       "that match are kept, and the first mismatch is replaced by the large model's own prediction. "
                       "Because text generation is limited by memory bandwidth rather than compute, verifying several "
                       "tokens costs about as much as generating one, so the method can yield a two- to three-fold "
                       "speedup while producing exactly the same output as the large model alone."]],
    "asr": [[os.path.join(HERE, "examples", "assisted_generation.wav")]],
}


def _as_gradio_error(exc: Exception) -> gr.Error:
    """What the user reads when a request fails: a user error (`USER_ERRORS`) says what to do; anything else says
    what happened. Either way the server keeps serving and the page keeps the input. A gr.Error is shown as it is:
    ZeroGPU's own (a visitor's quota used up, no GPU free) say what to do."""
    if isinstance(exc, gr.Error):
        return exc
    if isinstance(exc, USER_ERRORS):
        return gr.Error(str(exc))
    return gr.Error(f"generation failed ({type(exc).__name__}: {exc}); your input is kept, try again")


# A run streams into the status line and the two panels only, and hands its result to a follow-up event that
# draws the figures: Gradio processes every output of an event at every streamed update (a skipped one too), and the
# timed runs share the cores with that work.
STREAM_KEYS = ["status", "baseline_html", "assisted_html", "result"]
RESULT_KEYS = ["status", "baseline_figures", "assisted_figures", "summary", "plot", "raw"]


def _result_list(view_out: dict) -> list:
    """`RESULT_KEYS`' values, then the task's *Run again* button: shown when the comparison's timing is not
    reliable."""
    if not view_out:
        return [gr.skip()] * (len(RESULT_KEYS) + 1)
    return [view_out.get(k, gr.skip()) for k in RESULT_KEYS] + [gr.Button(visible=view_out["unreliable"])]


def _handlers(service: Service):
    """The page's Run handler for a task, and the /compare API function."""
    def make_handler(task: str):
        def handler(pair, content, language, settings_pair, max_new_tokens, temperature, top_p, draft_source,
                    window, schedule):
            view = LiveView()
            try:
                if settings_pair != pair:
                    # the Settings on screen were still another pair's (a tab picked and Run pressed before the
                    # page had the new tab's pair's settings): run this pair's own, which the page is about to show
                    max_new_tokens, draft_source, window, schedule = service.pair_defaults(pair)
                settings = service.settings(pair, max_new_tokens=max_new_tokens, temperature=temperature,
                                            top_p=top_p, draft_source=draft_source, num_assistant_tokens=window,
                                            schedule=schedule)
                kwargs = ({"audio": content, "language": language} if task == "asr" else
                          {"text": content, "target_language": language or "French"})
                # closed by Gradio when Stop is pressed or the page goes away: the service then stops the run
                with contextlib.closing(service.stream(task, pair, settings=settings, **kwargs)) as snapshots:
                    for snap in snapshots:
                        out = view.outputs(snap)
                        yield [out.get(k, gr.skip()) for k in STREAM_KEYS]
            except Exception as exc:
                raise _as_gradio_error(exc) from None
        return handler

    def api_compare(task: str, pair: str, text: str | None, audio: str | None, max_new_tokens: float,
                    temperature: float, draft_source: str, schedule: str | None = None,
                    num_assistant_tokens: float | None = None, language: str | None = None,
                    target_language: str | None = None, top_p: float | None = None):
        """Baseline then assisted generation on one input; returns the same JSON as `python -m assistgen compare
        --json`. draft_source, schedule and num_assistant_tokens default to the pair's own (models.yaml); language
        (speech) to auto-detection; target_language (translation) to French; top_p (sampling only) to 1."""
        try:
            settings = service.settings(pair, max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=1.0 if top_p is None else top_p,
                                        draft_source=draft_source or None, schedule=schedule or None,
                                        num_assistant_tokens=num_assistant_tokens)
            # A generator with one output, the JSON at the end: Gradio closes it between two snapshots when the
            # client cancels the job or goes away, and the service then stops the run (`Service.stream`)
            with contextlib.closing(service.stream(task, pair, text=text, audio=audio, settings=settings,
                                                   language=language or None,
                                                   target_language=target_language or "French")) as snapshots:
                for snap in snapshots:
                    yield gr.skip() if snap.comparison is None else snap.comparison.to_dict()
        except Exception as exc:
            raise _as_gradio_error(exc) from None
    return make_handler, api_compare


def _settings_section(first_defaults: tuple[int, str, int, str]) -> tuple:
    """The Settings accordion: max new tokens, temperature, top-p, window, draft source, schedule."""
    with gr.Accordion("Settings", open=False, elem_id="settings"):
        with gr.Row():
            max_new_tokens = gr.Slider(*MAX_NEW_TOKENS_RANGE, value=first_defaults[0], step=1,
                                       label="max new tokens (speech: per 30 s window)", elem_id="max-new-tokens",
                                       info="each run stops after this many tokens, or at its end-of-text")
            temperature = gr.Slider(*TEMPERATURE_RANGE, value=0, step=0.05, label="temperature (0 = greedy)",
                                    info="above 0: sampled, and the two outputs differ by design")
            top_p = gr.Slider(*TOP_P_RANGE, value=1.0, step=0.05, label="top-p (sampling only)", elem_id="top-p",
                              info="below 1: sampled from the likeliest tokens that make up this share")
            window = gr.Slider(*WINDOW_RANGE, value=first_defaults[2], step=1,
                               label="initial window (num_assistant_tokens)", elem_id="window",
                               info="tokens the assistant drafts before the first target pass")
        with gr.Row():
            draft_source = gr.Radio([(label, name) for name, label in DRAFT_SOURCES.items()], value=first_defaults[1],
                                    label="draft source", elem_id="draft-source",
                                    info="where drafts come from; prompt lookup copies what followed the last "
                                         "tokens where they occurred before")
            schedule = gr.Radio(list(SCHEDULE_NAMES), value=first_defaults[3], elem_id="schedule",
                                label="window schedule",
                              info="heuristic: +2 after all drafts accepted, -1 otherwise; adaptive: each draft "
                                   "only while its confidence pays on this machine; constant")
    return max_new_tokens, temperature, top_p, draft_source, window, schedule


def _task_tab(service: Service, task: str, choices: list, pair_changed, pair_settings: list,
              settings_pair) -> tuple:
    """One task's tab: its pair, its input, its Run and Run-again buttons, its examples. Returns the pair dropdown
    too: picking the tab brings its pair's settings."""
    default = service.default_pair(choices)
    pair = gr.Dropdown(choices=choices, value=default, label="model pair", elem_id=f"pair-{task}",
                       info="the target model and the assistant that drafts for it")
    pair_info = gr.Markdown(service.pair_info(default) if default else "", elem_id=f"pair-info-{task}")
    # a pair's own defaults (max new tokens, window, schedule) come with it, as measured for it in models.yaml
    pair.change(pair_changed, inputs=pair, outputs=pair_settings + [pair_info, settings_pair],
                api_visibility="private", queue=False)
    if task == "asr":
        content = gr.Audio(sources=["upload", "microphone"], type="filepath", format=None,
                           label=f"speech (up to {duration_text(service.limits.max_audio_s)}; a recording longer than "
                                 "30 s is transcribed in windows)", elem_id="input-asr")
    else:
        content = gr.Textbox(lines=5, label="your text", elem_id=f"input-{task}",
                             info="both runs read this same input",
                             placeholder={"chat": "Ask something, or paste code to complete…",
                                          "translation": "Text to translate…",
                                          "summarization": "Text to summarize…"}[task])
    if task == "asr":
        language = gr.Dropdown(spoken_language_choices(), value="auto", label="spoken language",
                               elem_id="language-asr", info="auto: the target detects it over the first 30 s")
    else:
        language = gr.Dropdown(list(LANGUAGES), value="French", label="translate into", visible=task == "translation",
                               info="the language the target translates into")
    with gr.Row():
        button = gr.Button("Run baseline, then assisted", variant="primary", elem_id=f"run-{task}")
        rerun = gr.Button("Timing not reliable: run again", variant="secondary", visible=False,
                          elem_id=f"rerun-{task}")
        stop = gr.Button("Stop", variant="stop", visible=False, elem_id=f"stop-{task}")
    gr.Examples(EXAMPLES[task], inputs=[content, language] if task == "translation" else [content])
    return (button, rerun, stop), [pair, content, language], (pair, pair_info)


def _results_section() -> dict:
    """Status, the two columns, the summary, the per-pass plot and the raw JSON, by the names of STREAM_KEYS and
    RESULT_KEYS."""
    status = gr.Markdown("Pick a pair, give an input and press *Run*.", elem_id="status")
    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown("### Baseline: target alone (runs first)")
            baseline_html = gr.HTML(elem_id="baseline-output")
            baseline_figures = gr.Markdown(elem_id="baseline-figures")
        with gr.Column():
            gr.Markdown("### Assisted: drafts verified by the target")
            assisted_html = gr.HTML(elem_id="assisted-output")
            assisted_figures = gr.Markdown(elem_id="assisted-figures")
    gr.HTML(LEGEND)
    summary = gr.HTML(elem_id="summary")
    plot = gr.Plot(label="assisted run, per target pass",
                   elem_id="steps-plot")
    with gr.Accordion("Raw result (JSON, as the API returns it)", open=False):
        raw = gr.JSON()
    return {"status": status, "baseline_html": baseline_html, "baseline_figures": baseline_figures,
            "assisted_html": assisted_html, "assisted_figures": assisted_figures, "summary": summary, "plot": plot,
            "raw": raw, "result": gr.State()}


def _when_over(running, stop, run) -> None:
    """Once a run is over, hide Stop and let Run be pressed again, whether it finished or raised (an input's error):
    this Gradio's `.then` does not follow an event that raised, `.failure` does."""
    for after in (running.then, running.failure):
        after(lambda: (gr.Button(visible=False), gr.Button(interactive=True)), outputs=[stop, run], queue=False,
              api_visibility="private", show_progress="hidden")


def _api_endpoint(api_compare) -> None:
    """The documented API endpoint, /compare: named inputs, one JSON object out."""
    with gr.Column(visible=False):
        api_inputs = [gr.Textbox(label="task"), gr.Textbox(label="pair"), gr.Textbox(label="text"),
                      gr.Audio(type="filepath", format=None, label="audio"), gr.Number(label="max_new_tokens"),
                      gr.Number(label="temperature"), gr.Textbox(label="draft_source"),
                      gr.Textbox(label="schedule", value=""), gr.Number(label="num_assistant_tokens", value=None),
                      gr.Textbox(label="language", value=""), gr.Textbox(label="target_language", value=""),
                      gr.Number(label="top_p", value=1.0)]
        api_button = gr.Button("api")
        api_out = gr.JSON()
    api_button.click(api_compare, inputs=api_inputs, outputs=api_out, api_name="compare", concurrency_id="model",
                     concurrency_limit=1)


EXPLORE_INTRO = """Check the claims made about assisted generation on your own input: sweep one setting and watch the
speedup (median and range over repeats), tokens per pass and acceptance change. Each run is a full comparison, baseline
then assisted, with the same speed probes as above; settings that are not swept are the pair's own, at temperature
0. The formula's prediction (Leviathan et al.) from each run's measured acceptance α and cost ratio c is shown beside
the measured speedup, with the break-even map."""


def _explore_handler(service: Service, switches: StopSwitches):
    """The Explore tab's run: the sweep's progress, plots, table and JSON as each run finishes, until it ends or this
    page's switch stops it."""
    def handler(task_name, pair_name, content, clip, setting, value_text, repeat_count, tokens, request: gr.Request):
        switch = switches.current(request.session_hash)
        try:
            title = f"{pair_name}, {TASK_LABELS.get(task_name, task_name)}"
            meta = {"pair": pair_name, "task": task_name, "repeats": repeat_count, "max_new_tokens": tokens}
            yield progress_html(None), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            sweep = explore(service, task_name, pair_name, over=setting, values=value_text, repeats=repeat_count,
                            max_new_tokens=tokens, text=content, audio=clip, stop=switch)
            # nothing new for a second: a chance for Gradio to close the stream (the page gone), which stops the sweep
            with contextlib.closing(keep_closable(sweep, IDLE_S, switch.set)) as steps:
                for step in steps:
                    if step is None:
                        yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                        continue
                    out = explore_outputs(setting, step, title, meta)
                    yield out["progress"], out["plot"], out["table"], out["break_even"], out["json"]
        except Exception as exc:
            raise _as_gradio_error(exc) from None
        finally:
            switches.release(request.session_hash, switch)
    return handler


def _explore_tab(service: Service) -> None:
    """The Explore tab: a pair, an input, one setting over a few values, repeats; the plot grows run by run."""
    tasks = [(label, task) for task, label in TASK_LABELS.items()]
    first_task = tasks[0][1]
    choices = service.pair_choices(first_task)
    first_pair = service.default_pair(choices)
    gr.Markdown(EXPLORE_INTRO)
    with gr.Row():
        task = gr.Dropdown(tasks, value=first_task, label="task", elem_id="explore-task",
                           info="the kind of input, as in the tabs above")
        pair = gr.Dropdown(choices, value=first_pair, label="model pair", elem_id="explore-pair",
                           info="target and assistant; the assistant sweep offers the pairs sharing this target")
    text = gr.Textbox(lines=3, label="your text", elem_id="explore-text", value=EXAMPLES["chat"][2][0],
                      info="the prompt every run of the sweep answers")
    audio = gr.Audio(sources=["upload", "microphone"], type="filepath", format=None, label="speech",
                     visible=False, elem_id="explore-audio")
    with gr.Row():
        over = gr.Dropdown([(label, name) for name, label in OVER.items()], value="temperature",
                           label="setting to sweep", elem_id="explore-over",
                           info="the one setting that changes from run to run; the others stay the pair's own")
        values = gr.Textbox(default_values(service.catalog, "temperature", first_task, first_pair),
                            label="its values, comma-separated", elem_id="explore-values",
                            info="one point of the plot per value")
        repeats = gr.Slider(1, 5, value=1, step=1, label="repeats per value", elem_id="explore-repeats",
                            info="runs per value: the plot shows their median and range")
        max_new_tokens = gr.Slider(*MAX_NEW_TOKENS_RANGE, value=DEFAULT_MAX_NEW_TOKENS, step=1,
                                   label="max new tokens per run", elem_id="explore-max-new-tokens",
                                   info="short runs keep a sweep to about a minute on two cores")
    with gr.Row():
        run = gr.Button("Run the sweep", variant="primary", elem_id="explore-run")
        stop = gr.Button("Stop", variant="stop", visible=False, elem_id="explore-stop")
    progress = gr.HTML(elem_id="explore-progress-box")
    plot = gr.Plot(label="speedup, tokens per pass, acceptance: grows run by run", elem_id="explore-plot")
    table = gr.Markdown(elem_id="explore-table")
    break_even = gr.Plot(label="break-even map: α (acceptance per draft) against c (cost per pass)",
                         elem_id="explore-break-even")
    with gr.Accordion("the sweep's JSON (as `python -m assistgen sweep --json` writes it)", open=False):
        sweep_out = gr.JSON(elem_id="explore-json")

    def task_changed(name):
        options = service.pair_choices(name)
        chosen = service.default_pair(options)
        return (gr.Dropdown(choices=options, value=chosen), gr.Textbox(visible=name != "asr"),
                gr.Audio(visible=name == "asr"))

    task.change(task_changed, inputs=task, outputs=[pair, text, audio], api_visibility="private", queue=False)
    for trigger in (over.change, pair.change):
        trigger(lambda setting, name, pair_name: default_values(service.catalog, setting, name, pair_name),
                inputs=[over, task, pair], outputs=values, api_visibility="private", queue=False)

    def start(request: gr.Request):
        switches.arm(request.session_hash)
        return gr.Button(visible=True), gr.Button(interactive=False), None, "", None, None

    # Stop sets this page's switch on the server, and the sweep stops at the model thread's next decoding step; the
    # handler then shows the finished points and says it was stopped (a Gradio cancel would drop that last update)
    switches = StopSwitches()
    handler = _explore_handler(service, switches)
    running = run.click(start, outputs=[stop, run, plot, table, break_even, sweep_out], queue=False,
                        api_visibility="private", show_progress="hidden"
                        ).then(handler, inputs=[task, pair, text, audio, over, values, repeats, max_new_tokens],
                               outputs=[progress, plot, table, break_even, sweep_out], concurrency_id="model",
                               concurrency_limit=1, api_visibility="private", show_progress="hidden")
    _when_over(running, stop, run)

    def press_stop(request: gr.Request):
        switches.press(request.session_hash)
        return gr.Button(visible=False)
    stop.click(press_stop, outputs=[stop], queue=False, api_visibility="private", show_progress="hidden")


def build_demo(service: Service) -> gr.Blocks:
    """The whole page. `service` does the work; tests pass one with a catalog of tiny models."""
    refuse_audio_urls()
    make_handler, api_compare = _handlers(service)
    choices_by_task = {task: service.pair_choices(task) for task in TASK_LABELS}  # availability once per task
    first_pair = service.default_pair(choices_by_task[next(iter(TASK_LABELS))])
    first_defaults = service.pair_defaults(first_pair) if first_pair else (128, "assistant", 5, "heuristic")

    def info_now(name):
        return service.pair_info(name) if name else ""

    def pair_changed(name):
        if not name:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), "", gr.skip()
        return (*service.pair_defaults(name), service.pair_info(name) + SETTINGS_RESET, name)

    with gr.Blocks(title="assistgen: assisted generation side by side") as demo:
        gr.Markdown(INTRO)
        max_new_tokens, temperature, top_p, draft_source, window, schedule = _settings_section(first_defaults)
        settings_pair = gr.State(first_pair)   # the pair whose own settings the Settings were last set to
        settings_inputs = [settings_pair, max_new_tokens, temperature, top_p, draft_source, window, schedule]
        pair_settings = [max_new_tokens, draft_source, window, schedule]
        runs = []
        with gr.Tabs():
            for task, label in TASK_LABELS.items():
                with gr.Tab(label, id=task) as tab:
                    buttons, inputs, (pair, pair_info) = _task_tab(service, task, choices_by_task[task],
                                                                    pair_changed, pair_settings, settings_pair)
                    runs.append((task, buttons, inputs, pair_info))
                # the settings are shared: a tab brings its own pair's
                tab.select(pair_changed, inputs=pair, outputs=pair_settings + [pair_info, settings_pair],
                           api_visibility="private", queue=False)
            with gr.Tab("Explore", id="explore"):
                _explore_tab(service)
        shown = _results_section()
        stream_outputs = [shown[k] for k in STREAM_KEYS]
        for task, (button, rerun, stop), inputs, pair_info in runs:
            # the line was drawn when the page was built; a pair prepared since (by the preload, a run, `prepare`)
            # no longer says it will be
            demo.load(info_now, inputs=inputs[0], outputs=pair_info, queue=False, api_visibility="private",
                      show_progress="hidden")
            result_outputs = [shown[k] for k in RESULT_KEYS] + [rerun]
            run_events = []
            for trigger in (button, rerun):
                # clear the last result and offer Stop at once, run (streaming), then draw this one's figures. Run
                # is off until the run is over: pressed while Gradio still winds a stopped run down, its new run
                # would be dropped
                running = trigger.click(lambda: _result_list(CLEARED) + [gr.Button(visible=True),
                                                                         gr.Button(interactive=False)],
                                        outputs=result_outputs + [stop, button], queue=False,
                                        api_visibility="private", show_progress="hidden"
                                        ).then(make_handler(task), inputs=inputs + settings_inputs,
                                               outputs=stream_outputs, concurrency_id="model", concurrency_limit=1,
                                               api_visibility="private",
                                               # the status line says what runs (and a load's progress): Gradio's
                                               # own progress overlay animated in the browser at about a fifth of a
                                               # core during the timed runs (measured on two cores), which the
                                               # page's baseline paid and the CLI's did not
                                               show_progress="hidden")
                _when_over(running, stop, button)
                # a pair's first run prepares its weights: the line under its dropdown stops saying it will
                running.then(info_now, inputs=inputs[0], outputs=pair_info, queue=False,
                             api_visibility="private", show_progress="hidden")
                running.success(lambda result: _result_list(result and result_outputs_of(result)),
                                inputs=shown["result"], outputs=result_outputs, queue=False,
                                api_visibility="private", show_progress="hidden")
                run_events.append(running)
            # Gradio closes the run's stream, and the service stops the run at its next step (`streaming.Stopped`)
            stop.click(lambda: (STOPPED, gr.Button(visible=False)), outputs=[shown["status"], stop],
                       cancels=run_events, queue=False, api_visibility="private", show_progress="hidden")
        _api_endpoint(api_compare)
    return demo


QUEUE_POLL_S = 0.05   # how often Gradio's queue looks for work to start (its own default: every millisecond)


def configure_queue(demo: gr.Blocks) -> gr.Blocks:
    """Model work runs one request at a time, behind a bounded queue.

    Gradio's queue polls for work every millisecond and its progress sender every 10 ms, on the server's event loop:
    a thousand wake-ups a second, each taking the GIL, about a tenth of a core on this machine, all of it during
    the timed runs, which the CLI does not pay. Polling every 50 ms (Gradio's own choice on Windows) costs a
    request at most 50 ms before it starts, outside the timed runs."""
    demo.queue(max_size=from_env().queue_size, default_concurrency_limit=1)
    if not gradio_compat.applies(gradio_compat.QUEUE_POLLING):
        return demo
    queue = demo._queue   # no public setting for these (Gradio 6.31)
    queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_POLL_S)
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, QUEUE_POLL_S)
    return demo


def queue_and_launch(demo: gr.Blocks, **kwargs):
    """The bounded queue (`configure_queue`), uploads and other request bodies capped server-side
    (`assistgen.app.body_limit`), the page's early script (`assistgen.app.frontend`), then serve."""
    configure_queue(demo)
    limits = limits_from_env()
    app_kwargs = kwargs.setdefault("app_kwargs", {})
    early = [Middleware(EarlyScript)] if gradio_compat.applies(gradio_compat.TIMER_SCRIPT) else []
    app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), *early,
                                Middleware(BodyLimit, max_bytes=body_limit_bytes(limits.max_input_tokens))]
    kwargs.setdefault("max_file_size", limits.max_file_size)
    return demo.launch(css=CSS, theme=gr.themes.Soft(), **kwargs)


def main() -> None:
    # The timed runs share the interpreter with the server: a thread that holds the GIL gives it back after at
    # most this long (5 ms by default), so a render or a request cannot stall a pass for long.
    sys.setswitchinterval(0.0005)
    limit_threads_to_usable_cpus()   # a container's CPU quota, not the host's cores
    try:
        catalog = load_catalog()
    except CatalogError as exc:
        print(f"assistgen: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(2)
    service = Service(catalog)
    demo = build_demo(service)
    if from_env().preload:
        # the default pairs load and warm up while the page is already served: the first click finds them ready
        import threading
        import time

        def preload(names=service.default_pairs()):
            started = time.perf_counter()
            failed = service.preload(names)
            ready = [n for n in names if n not in failed]
            done = "loaded" if zerogpu.active() else "loaded and warmed up"
            print(f"assistgen: {', '.join(ready) or 'no pair'} {done} in "
                  f"{time.perf_counter() - started:.1f} s" + (f"; could not preload {', '.join(failed)}" if failed
                                                               else ""), file=sys.stderr, flush=True)
        if zerogpu.active():   # ZeroGPU packs what is on "cuda" at launch, once, for its GPU workers: load it first
            preload()
        else:
            threading.Thread(target=preload, daemon=True, name="assistgen-preload").start()
    queue_and_launch(demo)


if __name__ == "__main__":
    main()
