// JSON Schema -> GBNF grammar, after llama.cpp's common/json-schema-to-grammar.cpp (what
// llama-server does with `json_schema` and `response_format: {type: json_schema}`): the
// same keywords, the same property order (required ones first, in the schema's order,
// then optional ones) and the same whitespace rule between tokens.
//
// The schema comes from an HTTP request, so everything is bounded: nesting depth, rule
// count, grammar size, repetition counts; $ref cycles become recursive rules, never an
// expansion. A schema the grammar cannot express is refused with a SchemaError whose
// message starts with the JSON pointer of the part at fault.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace pico::coordinator::http_api {

// A schema the converter cannot express: the message names the JSON pointer of the part
// ("/properties/age/pattern: ...") and why.
class SchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// GBNF text whose start rule is "root", accepting exactly the JSON documents that validate
// against `schema` (within what is supported) with llama.cpp's whitespace rules.
std::string json_schema_to_grammar(const nlohmann::ordered_json& schema);

// The grammar of any JSON object (response_format {type: json_object}).
std::string json_object_grammar();

}  // namespace pico::coordinator::http_api
