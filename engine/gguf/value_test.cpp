#include "gguf/value.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gguf/test_files.hpp"  // PrintTo for values

namespace pico::gguf {
namespace {

TEST(Value, EachStoredTypeReportsItsGgufTypeNumber) {
  // GGUF's numbering (gguf.h: GGUF_TYPE_UINT8 = 0 ... GGUF_TYPE_FLOAT64 = 12).
  EXPECT_EQ(static_cast<uint32_t>(Value(uint8_t{1}).type()), 0u);
  EXPECT_EQ(static_cast<uint32_t>(Value(int8_t{1}).type()), 1u);
  EXPECT_EQ(static_cast<uint32_t>(Value(uint16_t{1}).type()), 2u);
  EXPECT_EQ(static_cast<uint32_t>(Value(int16_t{1}).type()), 3u);
  EXPECT_EQ(static_cast<uint32_t>(Value(uint32_t{1}).type()), 4u);
  EXPECT_EQ(static_cast<uint32_t>(Value(int32_t{1}).type()), 5u);
  EXPECT_EQ(static_cast<uint32_t>(Value(1.0f).type()), 6u);
  EXPECT_EQ(static_cast<uint32_t>(Value(true).type()), 7u);
  EXPECT_EQ(static_cast<uint32_t>(Value("text").type()), 8u);
  EXPECT_EQ(static_cast<uint32_t>(Value(string_array({"a"})).type()), 9u);
  EXPECT_EQ(static_cast<uint32_t>(Value(uint64_t{1}).type()), 10u);
  EXPECT_EQ(static_cast<uint32_t>(Value(int64_t{1}).type()), 11u);
  EXPECT_EQ(static_cast<uint32_t>(Value(1.0).type()), 12u);
  EXPECT_EQ(value_type_name(ValueType::Float32), "float32");
  EXPECT_EQ(value_type_name(ValueType::String), "string");
  EXPECT_EQ(value_type_name(static_cast<ValueType>(99)), "unknown");
}

TEST(Value, AsIntCoversEveryIntegerTypeAndRefusesWhatDoesNotFit) {
  EXPECT_EQ(Value(uint8_t{255}).as_int(), 255);
  EXPECT_EQ(Value(int8_t{-128}).as_int(), -128);
  EXPECT_EQ(Value(uint16_t{65535}).as_int(), 65535);
  EXPECT_EQ(Value(int16_t{-32768}).as_int(), -32768);
  EXPECT_EQ(Value(uint32_t{4294967295u}).as_int(), int64_t{4294967295});
  EXPECT_EQ(Value(int32_t{-7}).as_int(), -7);
  EXPECT_EQ(Value(int64_t{std::numeric_limits<int64_t>::min()}).as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Value(uint64_t{9223372036854775807u}).as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Value(uint64_t{9223372036854775808u}).as_int(), std::nullopt);
  EXPECT_EQ(Value(true).as_int(), 1);
  EXPECT_EQ(Value(false).as_int(), 0);
  EXPECT_EQ(Value(1.5f).as_int(), std::nullopt);
  EXPECT_EQ(Value("12").as_int(), std::nullopt);
}

TEST(Value, AsFloatCoversNumbersOnly) {
  EXPECT_EQ(Value(1.5f).as_float(), 1.5);
  EXPECT_EQ(Value(-2.25).as_float(), -2.25);
  EXPECT_EQ(Value(int32_t{-3}).as_float(), -3.0);
  EXPECT_EQ(Value(uint64_t{1} << 60).as_float(), std::ldexp(1.0, 60));
  EXPECT_EQ(Value(true).as_float(), std::nullopt);
  EXPECT_EQ(Value("1.5").as_float(), std::nullopt);
}

TEST(Value, FloatsCompareByBitPattern) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(Value(nan), Value(nan));
  EXPECT_FALSE(Value(0.0f) == Value(-0.0f));
  EXPECT_FALSE(Value(0.0) == Value(-0.0));
  EXPECT_EQ(Value(std::numeric_limits<double>::quiet_NaN()), Value(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(Value(1.0f) == Value(1.0));  // same number, different type
}

TEST(Value, ArraysCompareTypeAndItems) {
  const Array a = make_array(ValueType::Int32, {int32_t{1}, int32_t{2}});
  EXPECT_EQ(a, make_array(ValueType::Int32, {int32_t{1}, int32_t{2}}));
  EXPECT_FALSE(a == make_array(ValueType::Int32, {int32_t{1}}));
  EXPECT_FALSE((Array{ValueType::Int32, {}} == Array{ValueType::UInt8, {}}));
  EXPECT_THROW(make_array(ValueType::Int32, {int32_t{1}, uint32_t{2}}), std::invalid_argument);
  const Array strings = string_array({"x", "", "yz"});
  EXPECT_EQ(strings.element_type, ValueType::String);
  ASSERT_EQ(strings.items.size(), 3u);
  EXPECT_EQ(*strings.items[2].string(), "yz");
}

TEST(Metadata, SetKeepsInsertionOrderAndReplacesInPlace) {
  Metadata m;
  m.set("b", uint32_t{1});
  m.set("a", "text");
  m.set("c", true);
  m.set("a", int64_t{5});  // replaced where it stands
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m.entries()[0].first, "b");
  EXPECT_EQ(m.entries()[1].first, "a");
  EXPECT_EQ(m.entries()[2].first, "c");
  EXPECT_EQ(m.entries()[1].second, Value(int64_t{5}));
  EXPECT_EQ(m.get_int("a"), 5);
}

TEST(Metadata, EraseKeepsLookupConsistent) {
  Metadata m;
  for (int i = 0; i < 5; ++i) m.set("k" + std::to_string(i), int32_t{i});
  EXPECT_TRUE(m.erase("k1"));
  EXPECT_FALSE(m.erase("k1"));
  EXPECT_FALSE(m.contains("k1"));
  ASSERT_EQ(m.size(), 4u);
  for (int i : {0, 2, 3, 4}) EXPECT_EQ(m.get_int("k" + std::to_string(i)), i) << i;
  m.set("k1", int32_t{10});
  EXPECT_EQ(m.entries().back().first, "k1");
  EXPECT_EQ(m.get_int("k1"), 10);
}

TEST(Metadata, TypedGettersReturnNothingForOtherTypes) {
  Metadata m;
  m.set("name", "llama");
  m.set("flag", true);
  m.set("ratio", 0.5f);
  m.set("list", string_array({"a"}));
  EXPECT_EQ(m.get_string("name"), "llama");
  EXPECT_EQ(m.get_string("flag"), std::nullopt);
  EXPECT_EQ(m.get_bool("flag"), true);
  EXPECT_EQ(m.get_bool("ratio"), std::nullopt);
  EXPECT_EQ(m.get_float("ratio"), 0.5);
  EXPECT_EQ(m.get_int("ratio"), std::nullopt);
  EXPECT_NE(m.get_array("list"), nullptr);
  EXPECT_EQ(m.get_array("name"), nullptr);
  EXPECT_EQ(m.find("missing"), nullptr);
  EXPECT_EQ(m.get_int("missing"), std::nullopt);
}

TEST(DisplayString, ScalarsAndEscapedStrings) {
  EXPECT_EQ(to_display_string(Value(uint8_t{200})), "200");
  EXPECT_EQ(to_display_string(Value(int8_t{-5})), "-5");
  EXPECT_EQ(to_display_string(Value(uint64_t{18446744073709551615u})), "18446744073709551615");
  EXPECT_EQ(to_display_string(Value(1.5f)), "1.5");
  EXPECT_EQ(to_display_string(Value(0.1)), "0.1");
  EXPECT_EQ(to_display_string(Value(true)), "true");
  EXPECT_EQ(to_display_string(Value("say \"hi\"\\\n\t\x01")), R"("say \"hi\"\\\n\t\x01")");
  EXPECT_EQ(to_display_string(Value("héllo")), "\"héllo\"");
}

TEST(DisplayString, LongArraysAreAbbreviated) {
  std::vector<Value> items;
  for (uint32_t i = 0; i < 100; ++i) items.emplace_back(i);
  const Value numbers = make_array(ValueType::UInt32, items);
  EXPECT_EQ(to_display_string(numbers, 3), "[0, 1, 2, ... 100 items]");
  EXPECT_EQ(to_display_string(Value(make_array(ValueType::UInt32, {uint32_t{7}, uint32_t{8}})), 3), "[7, 8]");
  EXPECT_EQ(to_display_string(Value(Array{ValueType::String, {}})), "[]");
  EXPECT_EQ(to_display_string(Value(string_array({"a", "b", "c"})), 2), R"(["a", "b", ... 3 items])");
  const Value nested = make_array(ValueType::Array, {Value(make_array(ValueType::Int8, {int8_t{1}})), Value(Array{})});
  EXPECT_EQ(to_display_string(nested), "[[1], []]");
}

}  // namespace
}  // namespace pico::gguf
