"""engine.chat_template: sandboxed chat-template rendering.

Oracles: (a) transformers' `apply_chat_template(..., tokenize=False)` with the tokenizer it
loads from the real SmolLM2-135M GGUF (VLLM_TEST_MODEL or ~/.cache/libvllm/models/), on that
file's template and on a feature template (loops, namespace, tojson, macros, formatting,
loop controls, `{% generation %}`); (b) hostile templates (sandbox escapes, CPU and memory
bombs, syntax errors, raise_exception), each of which must raise ChatTemplateError quickly;
(c) message validation and vLLM's text-part joining.
"""

import time

import pytest

from libvllm.engine import chat_template as ct
from libvllm.engine.chat_template import ChatTemplateError, render_chat_template
from libvllm.engine.errors import InvalidArgumentError

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is 2+2? Ünïcödé 你好 😀"}
ASSISTANT = {"role": "assistant", "content": "4.\n\nAnything else?"}
CONVERSATIONS = {
    "system+user": [SYSTEM, USER],
    "user only": [USER],
    "multi-turn": [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "  No, thanks.  "}],
    "ends with assistant": [USER, ASSISTANT],
    "system only": [SYSTEM],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo du jour",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
FEATURE_TEMPLATE = """\
{{ bos_token }}
{%- macro render(m) -%}<{{ m.role|upper }}>{{ m['content']|trim }}{% endmacro -%}
{% set ns = namespace(turns=0, last='') %}
{% if tools %}Tools:
{{ tools|tojson(indent=2) }}
{{ tools|map(attribute='function')|map(attribute='name')|join(', ') }}
{% endif %}
{% for m in messages if m.role != 'system' %}
{% if m.content is defined and m.content|length > 100000 %}{% break %}{% endif %}
{% set ns.turns = ns.turns + 1 %}{% set ns.last = m.role %}
{{ loop.index }}/{{ loop.length }}{{ ' last' if loop.last }}: {{ render(m) }}
{% generation %}{{ '%s|%05d' % (m.role, loop.revindex) }}{% endgeneration %}
{% if m.role == 'assistant' %}{% continue %}{% endif %}
{{ m.content|wordwrap(8, wrapstring='/')|indent(2, first=True) }}
{{ "{}:{:>4}".format(m.role, loop.index0) }} {{ m|tojson }}
{% else %}(empty)
{% endfor %}
{{ messages|selectattr('role', 'equalto', 'system')|list|length }} system;
{{ ns.turns }} turns, last {{ ns.last }}{{ eos_token }}
{% if add_generation_prompt %}<assistant>{% endif %}"""


@pytest.fixture(scope="module")
def hf(hf_test_tokenizer):
    return hf_test_tokenizer


@pytest.fixture(scope="module")
def gguf_template(model_path):
    from libvllm.engine.gguf.reader import GGUFReader

    return GGUFReader(model_path).metadata["tokenizer.chat_template"]


# --- (a) parity with transformers ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gguf_template_matches_transformers(hf, gguf_template, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    expected = hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = render_chat_template(
        gguf_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=hf.bos_token,
        eos_token=hf.eos_token,
    )
    assert got == expected
    if name == "user only":  # the SmolLM2 template injects its default system prompt
        assert got.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@pytest.mark.slow
@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_feature_template_matches_transformers(hf, name, tools):
    messages = CONVERSATIONS[name]
    expected = hf.apply_chat_template(
        messages,
        chat_template=FEATURE_TEMPLATE,
        tools=tools,
        tokenize=False,
        add_generation_prompt=True,
    )
    got = render_chat_template(
        FEATURE_TEMPLATE, messages, tools=tools, bos_token=hf.bos_token, eos_token=hf.eos_token
    )
    assert got == expected
    assert "Météo" in got or tools is None  # tojson keeps non-ASCII


def test_text_parts_joined_like_vllm():
    template = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    parts = [{"type": "text", "text": "a"}, "b", {"type": "input_text", "text": "c"}]
    messages = [
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "user"},
    ]
    assert render_chat_template(template, messages) == "[user:a\nb\nc][assistant:][user:]"
    # None-valued keys are dropped, like transformers and vLLM do
    probe = "{{ messages[0].tool_calls is defined }}"
    assert render_chat_template(probe, [messages[1]]) == "False"


def test_variables_reach_the_template():
    template = (
        "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ enable_thinking }}|"
        "{{ documents is none }}|{{ tools|length }}|{{ strftime_now('%Y')|length }}|{{ missing }}"
    )
    out = render_chat_template(
        template,
        [],
        bos_token="<s>",
        eos_token="</s>",
        add_generation_prompt=False,
        enable_thinking=True,
        tools=[{"a": 1}],
    )
    assert out == "<s>|</s>|False|True|True|1|4|"


def test_compiled_templates_are_cached():
    template = "{{ messages|length }} cached"
    before = ct._compile.cache_info().hits
    for _ in range(3):
        assert render_chat_template(template, [USER]) == "1 cached"
    assert ct._compile.cache_info().hits == before + 2


# --- (b) hostile templates -----------------------------------------------------------------

HOSTILE = {
    "__class__": "{{ ''.__class__ }}",
    "__subclasses__": "{{ ().__class__.__base__.__subclasses__() }}",
    "__globals__": "{{ cycler.__init__.__globals__ }}",
    "__mro__ via format": "{{ '{0.__class__.__mro__}'.format(1) }}",
    "list mutation": "{% set l = [] %}{{ l.append(1) }}",
    "namespace dunder": "{% set ns = namespace() %}{% set ns.__dict__ = 1 %}",
    "str * int": "{{ 'x' * 10**7 }}",
    "list * int": "{{ (['x' * 1000] * 100000)|join }}",
    "center filter": "{{ 'x'|center(10000000) }}",
    "center method": "{{ 'x'.center(10000000) }}",
    "indent": "{{ 'a\nb'|indent(999999999) }}",
    "replace": "{{ ('x' * 2000)|replace('x', 'x' * 2000) }}",
    "join separator": "{{ range(100000)|join('x' * 100000) }}",
    "join method": "{{ ('x' * 100000).join(range(100000)|map('string')) }}",
    "printf width": "{{ '%0999999999d' % 1 }}",
    "printf star": "{{ '%*d' % (999999999, 1) }}",
    "printf named width": "{{ '%(a)999999999d' % {'a': 7} }}",
    "format width": "{{ '{:>999999999}'.format(1) }}",
    "format nested width": "{{ '{:>{}}'.format(1, 999999999) }}",
    "format filter": "{{ '%999999999s'|format('x') }}",
    "power": "{{ 7 ** 100000000 }}",
    "concat doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"
    ),
    "list doubling": (
        "{% set ns = namespace(l=['x']) %}{% for i in range(64) %}"
        "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"
    ),
    "batch fill": "{{ [1]|batch(100000, 'x' * 1000000)|list|length }}",
    "dict.fromkeys": "{{ dict.fromkeys(range(100000), 'x' * 100000)|length }}",
    "shared refs via map": "{{ ([none] * 10**5)|map('default', 'x' * 10**6, true)|list|length }}",
    "tojson indent": "{{ [[1]]|tojson(indent=1000000000) }}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "lipsum": "{{ lipsum(100000) }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "include": "{% include 'other.jinja' %}",
    "syntax: for": "{% for %}",
    "syntax: unclosed": "{{ messages ",
    "syntax: unknown filter": "{{ messages|no_such_filter }}",
    "syntax: endfor": "{% endfor %}",
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_template_fails_fast(name):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError):
        render_chat_template(HOSTILE[name], [USER])
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        # no call inside the loops: only the loop hook sees them
        "{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
    ],
)
def test_nested_loops_hit_the_time_budget(template):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="longer than"):
        render_chat_template(template, [USER])
    assert time.monotonic() - start < 3.0


def test_error_messages_say_what_happened():
    with pytest.raises(ChatTemplateError, match="raised an error: Only user and assistant"):
        render_chat_template("{{ raise_exception('Only user and assistant roles') }}", [USER])
    with pytest.raises(ChatTemplateError, match="syntax error at line 2"):
        render_chat_template("ok\n{% if %}", [USER])
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat_template(HOSTILE["__globals__"], [USER])
    with pytest.raises(ChatTemplateError, match="work budget"):
        render_chat_template(HOSTILE["str * int"], [USER])
    assert issubclass(ChatTemplateError, InvalidArgumentError)


# --- (c) message validation ----------------------------------------------------------------

BAD_MESSAGES = {
    "not a list": {"role": "user", "content": "x"},
    "not a dict": ["hello"],
    "no role": [{"content": "x"}],
    "role not a string": [{"role": 1, "content": "x"}],
    "content a number": [{"role": "user", "content": 3}],
    "image part": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    "part without text": [{"role": "user", "content": [{"type": "text"}]}],
    "foreign object": [{"role": "user", "content": "x", "meta": object()}],
}


@pytest.mark.parametrize("name", BAD_MESSAGES)
def test_bad_messages_rejected(name):
    with pytest.raises(InvalidArgumentError):
        render_chat_template("{{ messages }}", BAD_MESSAGES[name])
