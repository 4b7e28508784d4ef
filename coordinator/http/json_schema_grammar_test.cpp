#include "http/json_schema_grammar.hpp"
#include "http/grammar_testing.hpp"

#include "sample/grammar.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace pico::coordinator::http_api {
namespace {

using json = nlohmann::ordered_json;

std::string grammar(const char* schema_text) { return json_schema_to_grammar(json::parse(schema_text)); }

// The body of rule `name` in `grammar`, or "" when there is no such rule.
std::string rule(const std::string& grammar, const std::string& name) {
  const std::string head = name + " ::= ";
  size_t pos = 0;
  if (!grammar.starts_with(head)) {
    pos = grammar.find("\n" + head);
    if (pos == std::string::npos) return "";
    ++pos;
  }
  pos += head.size();
  return grammar.substr(pos, grammar.find('\n', pos) - pos);
}

// The message of the SchemaError `schema_text` raises, or "" when it converts.
std::string error_of(const char* schema_text) {
  try {
    json_schema_to_grammar(json::parse(schema_text));
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_REFUSED(schema, pointer_and_reason)                                  \
  do {                                                                              \
    const std::string message = error_of(schema);                                   \
    EXPECT_TRUE(message.starts_with(pointer_and_reason)) << "message: " << message; \
  } while (0)

// ---- Structure of the generated rules ----

TEST(JsonSchemaGrammar, PrimitiveTypes) {
  EXPECT_EQ(rule(grammar(R"({"type": "string"})"), "root"), "string");
  EXPECT_EQ(rule(grammar(R"({"type": "string"})"), "string"), R"("\"" char* "\"")");
  EXPECT_EQ(rule(grammar(R"({"type": "boolean"})"), "root"), "boolean");
  EXPECT_EQ(rule(grammar(R"({"type": "boolean"})"), "boolean"), R"("true" | "false")");
  EXPECT_EQ(rule(grammar(R"({"type": "null"})"), "null"), R"("null")");
  const std::string number = grammar(R"({"type": "number"})");
  EXPECT_EQ(rule(number, "number"), R"("-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?)");
  EXPECT_EQ(rule(number, "integral-part"), "[0] | [1-9] [0-9]{0,15}");
  EXPECT_EQ(rule(grammar(R"({"type": "integer"})"), "integer"), R"("-"? integral-part)");
}

TEST(JsonSchemaGrammar, EveryGrammarHasRootAndSpace) {
  const std::string g = grammar(R"({"type": "integer"})");
  EXPECT_TRUE(g.starts_with("root ::= integer\n"));
  EXPECT_EQ(rule(g, "space"), R"(| " " | "\n"{1,2} [ \t]{0,20})");
}

TEST(JsonSchemaGrammar, RequiredPropertiesFirstInDeclarationOrder) {
  const std::string g = grammar(R"({
    "type": "object",
    "properties": {"b": {"type": "string"}, "c": {"type": "integer"}, "a": {"type": "boolean"}},
    "required": ["a", "b"]
  })");
  EXPECT_EQ(rule(g, "b-kv"), R"("\"b\"" space ":" space string)");
  EXPECT_EQ(rule(g, "a-kv"), R"("\"a\"" space ":" space boolean)");
  EXPECT_EQ(rule(g, "c-kv"), R"("\"c\"" space ":" space integer)");
  EXPECT_EQ(rule(g, "root"), R"("{" space b-kv "," space a-kv ( "," space ( c-kv ) )? space "}")");
}

TEST(JsonSchemaGrammar, OptionalPropertiesChainInOrder) {
  const std::string g = grammar(R"({
    "properties": {"x": {"type": "null"}, "y": {"type": "null"}, "z": {"type": "null"}}
  })");
  EXPECT_EQ(rule(g, "root"), R"("{" space ( x-kv x-rest | y-kv y-rest | z-kv )? space "}")");
  EXPECT_EQ(rule(g, "x-rest"), R"(( "," space y-kv )? y-rest)");
  EXPECT_EQ(rule(g, "y-rest"), R"(( "," space z-kv )?)");
}

TEST(JsonSchemaGrammar, NestedObjectRulesArePrefixedByTheirProperty) {
  const std::string g = grammar(R"({
    "type": "object",
    "properties": {"user": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "required": ["user"]
  })");
  EXPECT_EQ(rule(g, "root"), R"("{" space user-kv space "}")");
  EXPECT_EQ(rule(g, "user-kv"), R"("\"user\"" space ":" space user)");
  EXPECT_EQ(rule(g, "user"), R"("{" space user-name-kv space "}")");
  EXPECT_EQ(rule(g, "user-name-kv"), R"("\"name\"" space ":" space string)");
}

TEST(JsonSchemaGrammar, AdditionalProperties) {
  EXPECT_EQ(rule(grammar(R"({"type": "object", "additionalProperties": false})"), "root"), R"("{" space "}")");
  EXPECT_EQ(rule(grammar(R"({"type": "object", "additionalProperties": true})"), "root"), "object");
  const std::string only_extra = grammar(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_EQ(rule(only_extra, "additional-kv"), R"(string ":" space integer)");
  EXPECT_EQ(rule(only_extra, "root"), R"("{" space ( additional-kv ( "," space additional-kv )* )? space "}")");
  // With a declared property, the extra keys are the strings other than its name.
  const std::string g = grammar(R"({
    "properties": {"a": {"type": "number"}}, "required": ["a"], "additionalProperties": {"type": "string"}
  })");
  EXPECT_EQ(rule(g, "additional-k"),
            R"("\"" ("a" char+ | ([^"\\\x7F\x00-\x1Fa] | [\\] ([\x22\x5Cbfnrt] | "u" [0-9a-fA-F]{4})) char*)? "\"")");
  EXPECT_EQ(rule(g, "root"),
            R"("{" space a-kv ( "," space ( additional-kv ( "," space additional-kv )* ) )? space "}")");
}

TEST(JsonSchemaGrammar, Arrays) {
  EXPECT_EQ(rule(grammar(R"({"type": "array", "items": {"type": "boolean"}})"), "root"),
            R"("[" space (boolean ("," space boolean)*)? space "]")");
  EXPECT_EQ(rule(grammar(R"({"items": {"type": "boolean"}, "minItems": 2})"), "root"),
            R"("[" space boolean ("," space boolean)+ space "]")");
  EXPECT_EQ(rule(grammar(R"({"items": {"type": "boolean"}, "minItems": 1, "maxItems": 3})"), "root"),
            R"("[" space boolean ("," space boolean){0,2} space "]")");
  EXPECT_EQ(rule(grammar(R"({"items": {"type": "boolean"}, "maxItems": 1})"), "root"),
            R"("[" space (boolean)? space "]")");
  EXPECT_EQ(rule(grammar(R"({"items": {"type": "boolean"}, "maxItems": 0})"), "root"), R"("[" space space "]")");
  EXPECT_EQ(rule(grammar(R"({"prefixItems": [{"type": "string"}, {"type": "null"}]})"), "root"),
            R"("[" space string "," space null space "]")");
  EXPECT_EQ(rule(grammar(R"({"type": "array", "items": false})"), "root"), R"("[" space space "]")");
}

TEST(JsonSchemaGrammar, ConstAndEnum) {
  EXPECT_EQ(rule(grammar(R"({"const": "on"})"), "root"), R"("\"on\"")");
  EXPECT_EQ(rule(grammar(R"({"const": {"k": [1, null]}})"), "root"), R"("{\"k\":[1,null]}")");
  EXPECT_EQ(rule(grammar(R"({"enum": ["red", 7, null, true]})"), "root"), R"("\"red\"" | "7" | "null" | "true")");
  EXPECT_EQ(rule(grammar(R"({"const": "say \"hi\"\n"})"), "root"), R"("\"say \\\"hi\\\"\\n\"")");
}

TEST(JsonSchemaGrammar, AnyOfOneOfAndTypeLists) {
  const std::string any_of = grammar(R"({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]})");
  EXPECT_EQ(rule(any_of, "root"), "string | root-1");
  EXPECT_EQ(rule(any_of, "root-1"), "[1-9] [0-9]{0,15}");
  EXPECT_EQ(rule(grammar(R"({"oneOf": [{"type": "null"}, {"type": "boolean"}]})"), "root"), "null | boolean");
  EXPECT_EQ(rule(grammar(R"({"type": ["string", "null"]})"), "root"), "string | null");
  const std::string nullable_array = grammar(R"({"type": ["array", "null"], "items": {"type": "integer"}})");
  EXPECT_EQ(rule(nullable_array, "root"), "array-1 | null");
  EXPECT_EQ(rule(nullable_array, "array-1"), R"("[" space (integer ("," space integer)*)? space "]")");
}

TEST(JsonSchemaGrammar, RefsToDefinitions) {
  const std::string g = grammar(R"({
    "type": "object",
    "properties": {"home": {"$ref": "#/$defs/Address"}, "work": {"$ref": "#/definitions/Place"}},
    "required": ["home", "work"],
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "definitions": {"Place": {"$ref": "#/$defs/Address"}}
  })");
  EXPECT_EQ(rule(g, "address"), R"("{" space address-city-kv space "}")");
  EXPECT_EQ(rule(g, "place"), "address");
  EXPECT_EQ(rule(g, "home-kv"), R"("\"home\"" space ":" space address)");
  EXPECT_EQ(rule(g, "work-kv"), R"("\"work\"" space ":" space place)");
}

TEST(JsonSchemaGrammar, RecursiveRefBecomesRecursiveRule) {
  const std::string g = grammar(R"({
    "$ref": "#/$defs/Node",
    "$defs": {"Node": {
      "type": "object",
      "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
      "required": ["value"]
    }}
  })");
  EXPECT_EQ(rule(g, "root"), "node");
  EXPECT_EQ(rule(g, "node-children"), R"("[" space (node ("," space node)*)? space "]")");
  EXPECT_EQ(rule(g, "node"), R"("{" space node-value-kv ( "," space ( node-children-kv ) )? space "}")");
  // The whole document as the target of "#".
  const std::string list = grammar(R"({"type": "array", "items": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}})");
  EXPECT_EQ(rule(list, "root"), R"("[" space (item ("," space item)*)? space "]")");
  EXPECT_EQ(rule(list, "item"), "null | root");
}

TEST(JsonSchemaGrammar, StringFormats) {
  const std::string date = grammar(R"({"type": "string", "format": "date"})");
  EXPECT_EQ(rule(date, "root"), "date-string");
  EXPECT_EQ(rule(date, "date-string"), R"("\"" date "\"")");
  EXPECT_EQ(rule(date, "date"), R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1]))");
  const std::string date_time = grammar(R"({"type": "string", "format": "date-time"})");
  EXPECT_EQ(rule(date_time, "date-time"), R"(date "T" time)");
  EXPECT_NE(rule(date_time, "time"), "");
  EXPECT_EQ(rule(grammar(R"({"type": "string", "format": "uuid"})"), "uuid"),
            R"("\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"")");
  EXPECT_EQ(rule(grammar(R"({"type": "string", "format": "email"})"), "root"), "string");  // unknown: any string
}

TEST(JsonSchemaGrammar, StringLength) {
  EXPECT_EQ(rule(grammar(R"({"type": "string", "minLength": 1})"), "root"), R"("\"" char+ "\"")");
  EXPECT_EQ(rule(grammar(R"({"type": "string", "minLength": 2, "maxLength": 5})"), "root"), R"("\"" char{2,5} "\"")");
  EXPECT_EQ(rule(grammar(R"({"type": "string", "maxLength": 3})"), "root"), R"("\"" char{0,3} "\"")");
  EXPECT_EQ(rule(grammar(R"({"type": "string", "minLength": 4, "maxLength": 4})"), "root"), R"("\"" char{4} "\"")");
}

TEST(JsonSchemaGrammar, IntegerBounds) {
  auto root = [](const char* schema) { return rule(grammar(schema), "root"); };
  EXPECT_EQ(root(R"({"type": "integer", "minimum": 0, "maximum": 23})"), "[0-9] | [1] [0-9] | [2] [0-3]");
  EXPECT_EQ(root(R"({"type": "integer", "minimum": 0})"), "[0-9] | [1-9] [0-9]{1,15}");
  EXPECT_EQ(root(R"({"type": "integer", "minimum": 10, "maximum": 99})"), "[1-9] [0-9]");
  EXPECT_EQ(root(R"({"type": "integer", "minimum": 15, "maximum": 300})"),
            "[1] [5-9] | [2-9] [0-9] | [1-2] [0-9]{2} | [3] \"00\"");
  EXPECT_EQ(root(R"({"type": "integer", "minimum": -5, "maximum": 5})"), R"("-" [1-5] | [0-5])");
  EXPECT_EQ(root(R"({"type": "integer", "maximum": -10})"), R"("-" [1-9] [0-9]{1,15})");
  EXPECT_EQ(root(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})"), "[1-9]");
  EXPECT_EQ(root(R"({"type": "integer", "minimum": 1.5, "maximum": 3.5})"), "[2-3]");
}

TEST(JsonSchemaGrammar, Patterns) {
  auto root = [](const char* pattern) {
    return rule(json_schema_to_grammar(json{{"type", "string"}, {"pattern", pattern}}), "root");
  };
  EXPECT_EQ(root("^abc$"), R"("\"" ("abc") "\"")");
  EXPECT_EQ(root("^ab?c*d+$"), R"("\"" ("a" "b"? "c"* "d"+) "\"")");
  EXPECT_EQ(root("^[a-z]{2,4}$"), R"("\"" ([a-z]{2,4}) "\"")");
  // A repeated group is a rule of its own: nested counts never multiply copies.
  const std::string repeated = json_schema_to_grammar(json{{"type", "string"}, {"pattern", "^(ab|cd){3}$"}});
  EXPECT_EQ(rule(repeated, "root"), R"("\"" (root-part{3}) "\"")");
  EXPECT_EQ(rule(repeated, "root-part"), R"("ab" | "cd")");
  EXPECT_EQ(root("^x|y$"), R"("\"" ("x" char* | char* "y") "\"")");
  EXPECT_EQ(root("abc"), R"("\"" (char* "abc" char*) "\"")");
  EXPECT_EQ(root(R"(^\d+\.\d$)"), R"("\"" ([0-9]+ "." [0-9]) "\"")");
  // A quote in the pattern is escaped in the JSON text the model writes.
  EXPECT_EQ(root(R"(^say "hi"$)"), R"("\"" ("say \\\"hi\\\"") "\"")");
  // '.' is any character but a line break, escaped characters included.
  EXPECT_EQ(
      root("^.$"),
      R"("\"" (([^\x00-\x1F\x22\x5C\x7F\u2028\u2029] | [\\] [\x22\x5Cbft] | "\\u00" ("0" [0-7bBeEfF] | "1" [0-9a-fA-F] | "7" [fF]))) "\"")");
}

TEST(JsonSchemaGrammar, EmptySchemaAndTrueAreAnyValue) {
  for (const char* any : {"{}", "true", R"({"description": "anything"})"}) {
    const std::string g = grammar(any);
    EXPECT_EQ(rule(g, "root"), "value") << any;
    EXPECT_EQ(rule(g, "value"), "object | array | string | number | boolean | null");
  }
}

TEST(JsonSchemaGrammar, JsonObjectGrammar) {
  const std::string g = json_object_grammar();
  EXPECT_EQ(rule(g, "root"), "object");
  EXPECT_EQ(rule(g, "object"),
            R"("{" space ( string ":" space value ("," space string ":" space value)* )? space "}")");
  EXPECT_EQ(rule(g, "array"), R"("[" space ( value ("," space value)* )? space "]")");
  EXPECT_EQ(rule(g, "char"), R"([^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4}))");
}

TEST(JsonSchemaGrammar, AllOfMergesObjects) {
  const std::string g = grammar(R"({
    "allOf": [
      {"$ref": "#/$defs/Named"},
      {"properties": {"age": {"type": "integer"}}, "required": ["age"]},
      {"anyOf": [{"properties": {"nick": {"type": "string"}}}]}
    ],
    "$defs": {"Named": {"properties": {"name": {"type": "string"}}, "required": ["name"]}}
  })");
  EXPECT_EQ(rule(g, "root"), R"("{" space name-kv "," space age-kv ( "," space ( nick-kv ) )? space "}")");
  EXPECT_EQ(rule(grammar(R"({"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["c", "b", "d"]}]})"), "root"),
            R"("\"b\"" | "\"c\"")");
}

TEST(JsonSchemaGrammar, RuleNamesAreSanitizedAndUnique) {
  const std::string g = grammar(R"({
    "type": "object",
    "properties": {
      "First Name!": {"type": "object", "properties": {"x": {"type": "null"}}},
      "first-name": {"type": "object", "properties": {"y": {"type": "null"}}},
      "string": {"type": "object", "properties": {"z": {"type": "null"}}},
      "9lives": {"type": "object", "properties": {"w": {"type": "null"}}}
    },
    "required": ["First Name!", "first-name", "string", "9lives"]
  })");
  EXPECT_EQ(rule(g, "first-name-kv"), R"("\"First Name!\"" space ":" space first-name)");
  EXPECT_EQ(rule(g, "first-name-kv-1"), R"("\"first-name\"" space ":" space first-name-1)");
  EXPECT_EQ(rule(g, "string-1"), R"("{" space ( string-z-kv )? space "}")");
  EXPECT_EQ(rule(g, "r-9lives"), R"("{" space ( r-9lives-w-kv )? space "}")");
  // Every rule name is a dashed lowercase word, defined once.
  std::vector<std::string> names;
  for (size_t pos = 0; pos < g.size(); pos = g.find('\n', pos) + 1) {
    const std::string name = g.substr(pos, g.find(" ::= ", pos) - pos);
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-"), std::string::npos) << name;
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 0) << name;
    names.push_back(name);
  }
}

TEST(JsonSchemaGrammar, Deterministic) {
  const char* schema = R"({
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}},
                   "when": {"type": "string", "format": "date-time"}, "n": {"type": "integer", "maximum": 7}},
    "additionalProperties": {"$ref": "#/$defs/V"},
    "$defs": {"V": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"$ref": "#/$defs/V"}}]}}
  })";
  const std::string first = grammar(schema);
  EXPECT_EQ(grammar(schema), first);
  EXPECT_EQ(grammar(schema), first);
}

// ---- Refusals: a SchemaError naming the part at fault ----

TEST(JsonSchemaGrammar, RefusesWhatItCannotExpress) {
  EXPECT_REFUSED(R"({"type": "kaboom"})", "/type: unknown type 'kaboom'");
  EXPECT_REFUSED(R"({"type": 12})", "/type: must be a type name");
  EXPECT_REFUSED(R"({"type": []})", "/type: an empty list");
  EXPECT_REFUSED("false", "(root): the schema false");
  EXPECT_REFUSED(R"({"properties": {"a": false}})", "/properties/a: the schema false");
  EXPECT_REFUSED("[1]", "(root): a schema must be an object or a boolean");
  EXPECT_REFUSED(R"({"enum": []})", "/enum: must be a non-empty array");
  EXPECT_REFUSED(R"({"anyOf": []})", "/anyOf: must be a non-empty array");
  EXPECT_REFUSED(R"({"properties": {"age": {"type": "string", "pattern": "^(?=x)$"}}})",
                 "/properties/age/pattern: lookaround");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^(a)\\1$"})", "/pattern: unsupported escape \\1");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^a\\bc$"})", "/pattern: word boundaries");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^a$b"})", "/pattern: '$' is supported only");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "a^b"})", "/pattern: '^' is supported only");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^(ab"})", "/pattern: missing ')'");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^ab)$"})", "/pattern: unbalanced ')'");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^[ab$"})", "/pattern: unterminated character class");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^*a$"})", "/pattern: nothing to repeat");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^a{3,2}$"})", "/pattern: {m,n} quantifier with m > n");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^a{20000}$"})", "/pattern: repetition count above 2000");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^[z-a]$"})", "/pattern: character range out of order");
  EXPECT_REFUSED(R"({"type": "string", "pattern": "^[^\\s\\S]$"})", "/pattern: a character class that matches nothing");
}

TEST(JsonSchemaGrammar, RefusesBadRefs) {
  EXPECT_REFUSED(R"({"$ref": "https://example.com/schema.json"})", "/$ref: only references inside the schema");
  EXPECT_REFUSED(R"({"$ref": "other.json#/a"})", "/$ref: only references inside the schema");
  EXPECT_REFUSED(R"({"$ref": "#/$defs/Missing", "$defs": {}})", "/$ref: '#/$defs/Missing' does not resolve");
  EXPECT_REFUSED(R"({"$ref": "#node"})", "/$ref: anchor references");
  EXPECT_REFUSED(R"({"$ref": 5})", "/$ref: must be a string");
  // A cycle with no '{' or '[' in between would be a rule that can never finish.
  EXPECT_REFUSED(R"({"$ref": "#"})", "/$ref: reference cycle that consumes no input");
  EXPECT_REFUSED(
      R"({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}}})",
      "/$defs/B/anyOf/0/$ref: reference cycle that consumes no input");
}

TEST(JsonSchemaGrammar, RefusesOutOfBoundCounts) {
  EXPECT_REFUSED(R"({"items": {"type": "null"}, "maxItems": 2001})", "/maxItems: above 2000");
  EXPECT_REFUSED(R"({"items": {"type": "null"}, "minItems": 20000})", "/minItems: above 2000");
  EXPECT_REFUSED(R"({"items": {"type": "null"}, "minItems": -1})", "/minItems: must be a non-negative integer");
  EXPECT_REFUSED(R"({"items": {"type": "null"}, "minItems": 3, "maxItems": 2})", "/maxItems: is below minItems");
  EXPECT_REFUSED(R"({"type": "string", "maxLength": 1e9})", "/maxLength: must be a non-negative integer");
  EXPECT_REFUSED(R"({"type": "string", "maxLength": 50000})", "/maxLength: above 2000");
  EXPECT_REFUSED(R"({"type": "integer", "minimum": 5, "maximum": 4})", "(root): no integer");
  EXPECT_REFUSED(R"({"type": "integer", "minimum": 1e20})", "(root): no integer");
  EXPECT_REFUSED(R"({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["b"],
                     "additionalProperties": false})",
                 "/required: 'b' is required but additionalProperties is false");
}

TEST(JsonSchemaGrammar, RefusesUnboundedInput) {
  // Depth: 100 nested arrays.
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(100, '}');
  EXPECT_TRUE(error_of(deep.c_str()).find("nested deeper than 64 levels") != std::string::npos);
  // Rules: 20000 distinct properties each need rules.
  json wide = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 20000; ++i) wide["properties"]["p" + std::to_string(i)] = {{"type", "null"}};
  EXPECT_THROW(json_schema_to_grammar(wide), SchemaError);
  // Long property names are refused rather than copied into rule names and tries.
  json long_name = {{"properties", {{std::string(2000, 'k'), {{"type", "null"}}}}}};
  EXPECT_THROW(json_schema_to_grammar(long_name), SchemaError);
  // Extra keys must differ from every declared name: the names are bounded in total.
  json many_names = {{"properties", json::object()}, {"additionalProperties", {{"type", "null"}}}};
  for (int i = 0; i < 100; ++i) many_names["properties"][std::to_string(i) + std::string(900, 'a')] = true;
  EXPECT_REFUSED(many_names.dump().c_str(), "(root): too many property names");
  // A property named "*" is an ordinary property.
  const std::string star = grammar(R"({"properties": {"*": {"type": "null"}, "b": {"type": "null"}}})");
  EXPECT_EQ(rule(star, "root"), R"("{" space ( kv rest | b-kv )? space "}")");
  EXPECT_EQ(rule(star, "rest"), R"(( "," space b-kv )?)");
  // A long chain of references stays bounded by the depth limit.
  json chain = {{"$ref", "#/$defs/d0"}, {"$defs", json::object()}};
  for (int i = 0; i < 200; ++i) {
    chain["$defs"]["d" + std::to_string(i)] = {{"type", "array"},
                                               {"items", {{"$ref", "#/$defs/d" + std::to_string(i + 1)}}}};
  }
  chain["$defs"]["d200"] = {{"type", "null"}};
  EXPECT_THROW(json_schema_to_grammar(chain), SchemaError);
  // allOf does not share work between references: a doubling tree of them hits the work cap.
  json doubling = {{"allOf", {{{"$ref", "#/$defs/d0"}}}}, {"$defs", json::object()}};
  for (int i = 0; i < 60; ++i) {
    const std::string next = "#/$defs/d" + std::to_string(i + 1);
    doubling["$defs"]["d" + std::to_string(i)] = {{"allOf", {{{"$ref", next}}, {{"$ref", next}}}}};
  }
  doubling["$defs"]["d60"] = {{"properties", {{"x", {{"type", "null"}}}}}};
  EXPECT_THROW(json_schema_to_grammar(doubling), SchemaError);
  // Nested counted repetitions in a pattern stay small: one rule per repeated group.
  const std::string nested = json_schema_to_grammar(json{{"type", "string"}, {"pattern", "^((a{2000}){2000}){2000}$"}});
  EXPECT_LT(nested.size(), 2000u);
}

// ---- Round trip: documents the grammar must accept or refuse ----
//
// Hand-written cases for every supported feature. Enable RoundTrip once the GBNF matcher
// (engine/sample/grammar.hpp) lands: each valid document must be accepted as a whole,
// each invalid one refused. "Invalid" means refused by the grammar: that includes a few
// documents JSON Schema accepts but llama.cpp's layout does not (marked "order": properties
// out of the schema's order).
struct RoundTripCase {
  const char* name;
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
};

const std::vector<RoundTripCase>& round_trip_cases() {
  static const std::vector<RoundTripCase> cases = {
      {"object with required and optional properties",
       R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
           "required": ["name"]})",
       {R"({"name": "Ann"})", R"({"name": "Ann", "age": 3})", R"({"name": "Ann", "ok": true})",
        R"({"name": "Ann", "age": -4, "ok": false})", "{\n  \"name\": \"\\u00e9\",\n  \"age\": 0\n}",
        R"({"name":"x","ok":false})"},
       {R"({})", R"({"age": 3})", R"({"age": 3, "name": "Ann"})" /* order */, R"({"name": "Ann", "extra": 1})",
        R"({"name": 5})", R"({"name": "Ann",})", R"({"name": "Ann", "age": 1.5})",
        R"({"name": "Ann", "ok": true, "age": 1})" /* order */}},
      {"nested object",
       R"({"type": "object", "properties": {"pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
           "required": ["x", "y"]}}, "required": ["pos"]})",
       {R"({"pos": {"x": 1, "y": -2.5e3}})", R"({ "pos": { "x": 0.25, "y": 7 } })"},
       {R"({"pos": {"x": 1}})", R"({"pos": [1, 2]})", R"({"pos": {"y": 2, "x": 1}})" /* order */,
        R"({"pos": {"x": 01, "y": 2}})"}},
      {"array with min and max items",
       R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
       {"[1]", "[1, 2]", "[1,2,3]", "[ 1 ]"},
       {"[]", "[1, 2, 3, 4]", "[1,]", R"(["1"])", "[1.0]"}},
      {"tuple",
       R"({"prefixItems": [{"type": "string"}, {"type": "integer"}]})",
       {R"(["a", 1])"},
       {R"(["a"])", R"([1, "a"])", R"(["a", 1, 2])"}},
      {"enum of strings and numbers",
       R"({"enum": ["red", "green", 42, 1.5, null]})",
       {R"("red")", R"("green")", "42", "1.5", "null"},
       {R"("blue")", "43", R"("42")", "red", "1.50"}},
      {"const", R"({"const": {"kind": "fixed"}})", {R"({"kind":"fixed"})"}, {R"({"kind":"other"})", "{}"}},
      {"anyOf",
       R"({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]})",
       {R"("ab")", R"("")", "10", "999"},
       {R"("abc")", "9", "-10", "true"}},
      {"oneOf", R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})", {"true", "null"}, {"0", R"("true")"}},
      {"nested $ref with $defs",
       R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/Pair"}}, "required": ["a"],
           "$defs": {"Pair": {"type": "array", "prefixItems": [{"$ref": "#/definitions/Id"}, {"$ref": "#/definitions/Id"}]}},
           "definitions": {"Id": {"type": "integer", "minimum": 1}}})",
       {R"({"a": [1, 2]})", R"({"a": [10,20]})"},
       {R"({"a": [0, 2]})", R"({"a": [1]})", R"({"a": 1})"}},
      {"recursive $ref (a tree)",
       R"({"$ref": "#/$defs/Tree", "$defs": {"Tree": {"type": "object", "properties": {"v": {"type": "integer"},
           "kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}}, "required": ["v"]}}})",
       {R"({"v": 1})", R"({"v": 1, "kids": []})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]})"},
       {R"({"v": 1, "kids": [{}]})", R"({"kids": []})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"w": 3}]}]})"}},
      {"string format date",
       R"({"type": "string", "format": "date"})",
       {R"("2024-02-29")", R"("1999-12-31")"},
       {R"("2024-13-01")", R"("2024-1-01")", R"("24-01-01")", R"("2024-01-32")"}},
      {"string format date-time",
       R"({"type": "string", "format": "date-time"})",
       {R"("2024-05-06T07:08:09Z")", R"("2024-05-06T23:59:59.123+02:00")"},
       {R"("2024-05-06 07:08:09Z")", R"("2024-05-06T24:00:00Z")", R"("2024-05-06T07:08:09")"}},
      {"string format time",
       R"({"type": "string", "format": "time"})",
       {R"("12:00:00Z")", R"("00:30:15-05:00")"},
       {R"("12:00Z")", R"("12:60:00Z")"}},
      {"string format uuid",
       R"({"type": "string", "format": "uuid"})",
       {R"("123e4567-e89b-12d3-a456-426614174000")", R"("ABCDEF01-2345-6789-abcd-ef0123456789")"},
       {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
      {"pattern",
       R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(-[a-z]+)?$"})",
       {R"("AB-123")", R"("XY-000-abc")"},
       {R"("ab-123")", R"("AB-12")", R"("AB-123-")", R"("xAB-123")"}},
      {"unanchored pattern",
       R"({"type": "string", "pattern": "c[ao]t"})",
       {R"("cat")", R"("a cot!")", R"("concat")"},
       {R"("cut")", R"("ct")"}},
      {"pattern with alternatives, dot and escapes",
       R"({"type": "string", "pattern": "^(yes|no)\\.{1,2}.$"})",
       {R"("yes.x")", R"("no..\"")", R"("no.\\")"},
       {R"("yes")", R"("maybe.x")", R"("yes...x")", R"("no.\n")"}},
      {"integer bounds",
       R"({"type": "integer", "minimum": -12, "maximum": 207})",
       {"-12", "-1", "0", "9", "10", "99", "100", "207"},
       {"-13", "208", "300", "1000", "-0012", "1.0"}},
      {"integer exclusive bounds",
       R"({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 50})",
       {"6", "49", "10"},
       {"5", "50", "0"}},
      {"integer lower bound only",
       R"({"type": "integer", "minimum": 25})",
       {"25", "30", "99", "100", "1234567"},
       {"24", "3", "-30", "0"}},
      {"additionalProperties false",
       R"({"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": false})",
       {"{}", R"({"a": null})"},
       {R"({"b": null})", R"({"a": null, "b": 1})"}},
      {"additionalProperties schema",
       R"({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"], "additionalProperties": {"type": "integer"}})",
       {R"({"a": null})", R"({"a": null, "b": 1, "c": 2})", R"({"a": null, "ab": 3})"},
       {R"({"a": null, "b": "x"})", R"({"b": 1})", R"({"a": null, "a": 1})"}},
      {"type list", R"({"type": ["string", "null"], "maxLength": 1})", {R"("a")", "null", R"("")"}, {R"("ab")", "0"}},
      {"empty schema is any value",
       "{}",
       {"{}", "[]", R"("s")", "1", "-2.5e10", "true", "null", R"({"a": [1, {"b": null}]})"},
       {"", "nul", "[1,]", "{'a': 1}"}},
      {"allOf merges objects",
       R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {"type": "string"}}}]})",
       {R"({"a": 1})", R"({"a": 1, "b": "x"})"},
       {R"({"b": "x"})", R"({"a": 1, "c": 2})"}},
      {"string length",
       R"({"type": "string", "minLength": 2, "maxLength": 3})",
       {R"("ab")", R"("abc")", R"("\n\t")"},
       {R"("a")", R"("abcd")"}},
      {"additional keys other than declared names sharing a prefix",
       R"({"properties": {"a": {"type": "null"}, "ab": {"type": "integer"}, "é": {"type": "boolean"}},
           "additionalProperties": {"type": "string"}})",
       {R"({"a": null, "ab": 1})", R"({"abc": "x", "b": "y"})", R"({"": "x"})", R"({"é": true, "ée": "s"})",
        R"({"a\"": "q"})"},
       {R"({"a": "x"})", R"({"ab": "x"})", R"({"é": "x"})", R"({"ab": 1, "a": null})" /* order */}},
      {"required property without a declaration",
       R"({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["b"]})",
       {R"({"b": 1})", R"({"b": [true], "a": null})"},
       {R"({"a": null})", "{}"}},
      {"negated class and non-ASCII in a pattern",
       R"({"type": "string", "pattern": "^[^a]é+$"})",
       {R"("bé")", R"("\"éé")", R"("\nééé")", R"("\\é")"},
       {R"("aé")", R"("b")", R"("ée")"}},
      {"nullable integer with bounds",
       R"({"type": ["integer", "null"], "minimum": 1, "maximum": 12})",
       {"1", "12", "null"},
       {"0", "13", R"("1")"}},
      {"array of enum objects",
       R"({"type": "array", "items": {"enum": [{"x": 1}, [2]]}, "maxItems": 2})",
       {R"([{"x":1}])", R"([[2], {"x":1}])", "[]"},
       {R"([{"x": 2}])", R"([[2], [2], [2]])"}},
  };
  return cases;
}

TEST(JsonSchemaGrammar, RoundTripCasesConvert) {
  for (const auto& c : round_trip_cases()) {
    EXPECT_NO_THROW(json_schema_to_grammar(json::parse(c.schema))) << c.name;
    for (const char* doc : c.valid) {
      EXPECT_TRUE(json::accept(doc)) << c.name << ": valid document is not even JSON: " << doc;
    }
  }
}

using testing::grammar_accepts;

TEST(JsonSchemaGrammar, RoundTrip) {
  for (const auto& c : round_trip_cases()) {
    const std::string g = json_schema_to_grammar(json::parse(c.schema));
    for (const char* doc : c.valid) EXPECT_TRUE(grammar_accepts(g, doc)) << c.name << ": refused " << doc;
    for (const char* doc : c.invalid) EXPECT_FALSE(grammar_accepts(g, doc)) << c.name << ": accepted " << doc;
  }
}

}  // namespace
}  // namespace pico::coordinator::http_api
