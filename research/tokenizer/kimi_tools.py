"""Kimi K2.5's TypeScript-style tool declarations: OpenAI-style tools (JSON schema) -> the tool_declare text.

Written from the format as public renderers of K2.5's chat template describe it (docs/checkpoints.md):
`# Tools\\n\\n## functions\\nnamespace functions {\\n...\\n}\\n`, per function its description as `// `
comments and `type NAME = (_: {...}) => any;`; properties required first, each group by name, with
description, constraint and default comments. Schema features it does not render ($ref, oneOf, ...)
raise ValueError naming them, rather than being dropped from what the model sees.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

_CONSTRAINTS = {'string': ('maxLength', 'minLength', 'pattern'), 'number': ('maximum', 'minimum'),
                'integer': ('maximum', 'minimum'), 'array': ('maxItems', 'minItems')}
_KNOWN = {'type', 'description', 'title', 'properties', 'required', 'additionalProperties', 'items', 'enum',
          'anyOf', 'default'}
_LIST_TYPE = {'object': '{}', 'array': 'Array<any>', 'integer': 'number'}
_SCALAR = {'string': 'string', 'boolean': 'boolean', 'null': 'null', 'any': 'any', 'number': 'number',
           'integer': 'number'}


def declare(tools: Sequence[Mapping[str, Any]]) -> str:
  """The tool_declare message's text; tools whose type is not 'function' are skipped."""
  functions = [t['function'] for t in tools if t.get('type') == 'function']
  if not functions:
    return '# Tools\n\n'
  return '# Tools\n\n## functions\nnamespace functions {\n' + '\n'.join(map(_function, functions)) + '\n}\n'


def _function(fn: Mapping[str, Any]) -> str:
  params = fn.get('parameters') or {}
  where = f'tool {fn["name"]!r} parameters'
  if params and params.get('type', 'object') != 'object':
    raise ValueError(f'{where}: must be an object schema, got type {params["type"]!r}')
  signature = f'type {fn["name"]} = (_: {_object(params, "", where)}) => any;'
  pieces = [_comment(fn.get('description') or '', ''), signature]
  return '\n'.join(p for p in pieces if p)


def _comment(text: str, indent: str) -> str:
  """`// line` per line of text (an empty line stays empty), no trailing newline."""
  return '\n'.join(f'{indent}// {line}' if line else '' for line in text.split('\n')) if text else ''


def _constraint_keys(schema: Mapping[str, Any]) -> tuple[str, ...]:
  """The constraints a schema's single type shows as a comment (none for type lists)."""
  kind = schema.get('type')
  return _CONSTRAINTS.get(kind, ()) if isinstance(kind, str) else ()


def _check(schema: Mapping[str, Any], where: str) -> None:
  allowed = _KNOWN | set(_constraint_keys(schema))
  unknown = sorted(set(schema) - allowed)
  if unknown:
    raise ValueError(f'{where}: unsupported JSON-schema feature {unknown[0]!r} (type {schema.get("type")!r}); '
                     f'the K2.5 declaration renders {sorted(allowed)}')


def _object(schema: Mapping[str, Any], indent: str, where: str) -> str:
  """`{` fields `}` at indent; required properties first, each group sorted by name."""
  _check(schema, where)
  props, required = schema.get('properties') or {}, set(schema.get('required') or ())
  if required - set(props):
    raise ValueError(f'{where}: required {sorted(required - set(props))} not among its properties')
  child = indent + '  '
  order = sorted(props, key=lambda k: (k not in required, k))
  fields = [_property(k, props[k], k not in required, child, f'{where}.{k}') for k in order]
  extra = schema.get('additionalProperties')
  if extra is not None:
    kind = {True: 'any', False: 'never'}[extra] if isinstance(extra, bool) else _type(extra, child, f'{where}.*')
    fields.append(f'{child}[k: string]: {kind}')
  return '{\n' + ',\n'.join(fields) + '\n' + indent + '}' if fields else '{}'


def _property(name: str, schema: Mapping[str, Any], optional: bool, indent: str, where: str) -> str:
  return _notes(schema, indent) + f'{indent}{name}{"?" if optional else ""}: {_type(schema, indent, where)}'


def _notes(schema: Mapping[str, Any], indent: str) -> str:
  """A schema's comment lines at indent, each ending in a newline: description, constraints, default."""
  lines = [_comment(schema['description'], indent)] if schema.get('description') else []
  constraints = sorted(k for k in _constraint_keys(schema) if k in schema)
  if constraints:
    lines.append(f'{indent}// ' + ', '.join(f'{k}: {schema[k]}' for k in constraints))
  if 'default' in schema:
    value = schema['default']
    shown = repr(value) if isinstance(value, (bool, int, float)) else json.dumps(value, ensure_ascii=False)
    lines.append(f'{indent}// Default: {shown}')
  return ''.join(line + '\n' for line in lines)


def _type(schema: Mapping[str, Any], indent: str, where: str) -> str:
  """A schema's TypeScript type, its continuation lines at indent."""
  _check(schema, where)
  kind = schema.get('type')
  if 'enum' in schema:
    return ' | '.join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema['enum'])
  if 'anyOf' in schema:
    return ' | '.join(_type(s, indent, f'{where}.anyOf[{i}]') for i, s in enumerate(schema['anyOf']))
  if isinstance(kind, list):
    return ' | '.join(_LIST_TYPE.get(k) or _scalar(k, where) for k in kind)
  if kind == 'object':
    return _object(schema, indent, where)
  if kind == 'array':
    return _array(schema.get('items') or {}, indent, f'{where}[]')
  return 'any' if kind is None else _scalar(kind, where)


def _scalar(kind: str, where: str) -> str:
  if kind not in _SCALAR:
    raise ValueError(f'{where}: unsupported JSON-schema type {kind!r}')
  return _SCALAR[kind]


def _array(items: Mapping[str, Any], indent: str, where: str) -> str:
  """Array<T>; items with a description or constraints put their comments inside, one level in."""
  if not items.get('description') and not set(_constraint_keys(items)) & set(items):
    return f'Array<{_type(items, indent, where)}>'
  child = indent + '  '
  return f'Array<\n{_notes(items, child)}{child}{_type(items, child, where)}\n{indent}>'
