#include "quant/type_traits.hpp"

#include <gtest/gtest.h>

#include <set>

namespace pico {
namespace {

TEST(TypeTraits, EveryRowIsFoundByItsNumberAndNamesAreUnique) {
  std::set<std::string_view> names;
  for (const TypeTraits& row : all_types()) {
    const TypeTraits* found = find_type(static_cast<uint32_t>(row.type));
    ASSERT_NE(found, nullptr) << row.name;
    EXPECT_EQ(found, &row);
    EXPECT_TRUE(names.insert(row.name).second) << "duplicate name " << row.name;
    EXPECT_GT(row.block_size, 0u);
    EXPECT_GT(row.block_bytes, 0u);
  }
}

TEST(TypeTraits, LayoutsMatchGgml) {
  struct Expected {
    GgmlType type;
    uint32_t block, bytes;
  };
  // Sizes of ggml's block structs (ggml-common.h), and ik_llama.cpp's block_q6_0.
  const Expected expected[] = {
      {GgmlType::F32, 1, 4},        {GgmlType::F16, 1, 2},        {GgmlType::BF16, 1, 2},
      {GgmlType::Q4_0, 32, 18},     {GgmlType::Q4_1, 32, 20},     {GgmlType::Q5_0, 32, 22},
      {GgmlType::Q5_1, 32, 24},     {GgmlType::Q8_0, 32, 34},     {GgmlType::Q8_1, 32, 36},
      {GgmlType::Q2_K, 256, 84},    {GgmlType::Q3_K, 256, 110},   {GgmlType::Q4_K, 256, 144},
      {GgmlType::Q5_K, 256, 176},   {GgmlType::Q6_K, 256, 210},   {GgmlType::Q8_K, 256, 292},
      {GgmlType::IQ4_NL, 32, 18},   {GgmlType::IQ4_XS, 256, 136}, {GgmlType::TQ1_0, 256, 54},
      {GgmlType::TQ2_0, 256, 66},   {GgmlType::MXFP4, 32, 17},    {GgmlType::Q1_0, 128, 18},
      {GgmlType::Q2_0, 64, 18},     {GgmlType::Q6_0, 32, 26},
  };
  for (const Expected& e : expected) {
    const TypeTraits& row = type_traits(e.type);
    EXPECT_EQ(row.block_size, e.block) << row.name;
    EXPECT_EQ(row.block_bytes, e.bytes) << row.name;
  }
}

TEST(TypeTraits, FieldsLieInsideTheirBlock) {
  for (const TypeTraits& row : all_types()) {
    for (const BlockField& field : row.fields) {
      EXPECT_LE(field.offset + field.width * field.count, row.block_bytes) << row.name;
    }
  }
}

TEST(TypeTraits, RetiredAndUnknownNumbersAreRefusedWithAReason) {
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u}) {
    EXPECT_EQ(find_type(retired), nullptr);
    EXPECT_NE(refusal_reason(retired).find("retired"), std::string_view::npos) << retired;
  }
  EXPECT_EQ(find_type(77), nullptr);
  EXPECT_EQ(refusal_reason(77), "unknown tensor type");
  EXPECT_TRUE(refusal_reason(8).empty());
}

TEST(TypeTraits, BytesOfChecksBlocksAndOverflow) {
  const TypeTraits& q4 = type_traits(GgmlType::Q4_0);
  EXPECT_EQ(bytes_of(q4, 64), 36u);
  EXPECT_FALSE(bytes_of(q4, 33).has_value());
  EXPECT_FALSE(bytes_of(type_traits(GgmlType::F32), UINT64_MAX / 2).has_value());
}

TEST(TypeTraits, ByteswapReversesOnlyTheNumberFields) {
  const TypeTraits& q8k = type_traits(GgmlType::Q8_K);
  std::vector<uint8_t> block(q8k.block_bytes);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> swapped = block;
  byteswap_blocks(q8k, swapped.data(), 1);
  EXPECT_EQ(swapped[0], 3);  // f32 d reversed
  EXPECT_EQ(swapped[3], 0);
  EXPECT_EQ(swapped[4], 4);  // int8 quants untouched
  EXPECT_EQ(swapped[260], block[261]);  // int16 bsums reversed pairwise
  EXPECT_EQ(swapped[261], block[260]);
  byteswap_blocks(q8k, swapped.data(), 1);
  EXPECT_EQ(swapped, block);
}

}  // namespace
}  // namespace pico
