// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {Test, Vm} from "forge-std/Test.sol";
import {Registry} from "../src/Registry.sol";

contract RegistryTest is Test {
    event Anchored(bytes32 indexed root, address indexed by, uint64 timestamp);

    Registry internal registry;
    address internal alice = makeAddr("alice");
    address internal bob = makeAddr("bob");
    bytes32 internal constant ROOT = keccak256("batch root 1");

    function setUp() public {
        registry = new Registry();
        vm.warp(1_700_000_000);
        vm.roll(19_000_000);
    }

    /// Slot of `_records[root]`: the mapping is the contract's only state variable (slot 0).
    function _slot(bytes32 root) internal pure returns (bytes32) {
        return keccak256(abi.encode(root, uint256(0)));
    }

    // ------------------------------------------------------------------ anchor / views

    function test_anchor_recordsSenderTimestampAndBlock() public {
        vm.prank(alice);
        registry.anchor(ROOT);
        (uint64 ts, uint64 bn, address by) = registry.anchoredAt(ROOT);
        assertEq(ts, 1_700_000_000);
        assertEq(bn, 19_000_000);
        assertEq(by, alice);
        assertTrue(registry.isAnchored(ROOT));
    }

    function test_anchor_emitsAnchored() public {
        vm.expectEmit(true, true, false, true, address(registry));
        emit Anchored(ROOT, alice, 1_700_000_000);
        vm.prank(alice);
        registry.anchor(ROOT);
    }

    function test_anchor_emitsExactlyOneLogWithTopics() public {
        vm.recordLogs();
        vm.prank(alice);
        registry.anchor(ROOT);
        Vm.Log[] memory logs = vm.getRecordedLogs();
        assertEq(logs.length, 1);
        assertEq(logs[0].topics.length, 3);
        assertEq(logs[0].topics[0], keccak256("Anchored(bytes32,address,uint64)"));
        assertEq(logs[0].topics[1], ROOT);
        assertEq(logs[0].topics[2], bytes32(uint256(uint160(alice))));
        assertEq(abi.decode(logs[0].data, (uint64)), 1_700_000_000);
    }

    function test_views_unknownRootIsEmpty() public view {
        assertFalse(registry.isAnchored(ROOT));
        (uint64 ts, uint64 bn, address by) = registry.anchoredAt(ROOT);
        assertEq(ts, 0);
        assertEq(bn, 0);
        assertEq(by, address(0));
    }

    function test_anchor_revertsOnRepeatBySameSender() public {
        vm.startPrank(alice);
        registry.anchor(ROOT);
        vm.expectRevert(abi.encodeWithSelector(Registry.AlreadyAnchored.selector, ROOT));
        registry.anchor(ROOT);
        vm.stopPrank();
    }

    function test_anchor_revertsOnRepeatByOtherSenderAndKeepsFirstRecord() public {
        vm.prank(alice);
        registry.anchor(ROOT);
        vm.warp(1_800_000_000);
        vm.roll(20_000_000);
        vm.prank(bob);
        vm.expectRevert(abi.encodeWithSelector(Registry.AlreadyAnchored.selector, ROOT));
        registry.anchor(ROOT);
        (uint64 ts, uint64 bn, address by) = registry.anchoredAt(ROOT);
        assertEq(ts, 1_700_000_000);
        assertEq(bn, 19_000_000);
        assertEq(by, alice);
    }

    function test_anchor_revertsOnZeroRoot() public {
        vm.expectRevert(Registry.ZeroRoot.selector);
        registry.anchor(bytes32(0));
        assertFalse(registry.isAnchored(bytes32(0)));
    }

    function test_anchor_revertsWhenTimestampDoesNotFit48Bits() public {
        vm.warp(uint256(1) << 48);
        vm.expectRevert(Registry.ClockOverflow.selector);
        registry.anchor(ROOT);
        assertFalse(registry.isAnchored(ROOT));
    }

    function test_anchor_revertsWhenBlockNumberDoesNotFit48Bits() public {
        vm.roll(uint256(1) << 48);
        vm.expectRevert(Registry.ClockOverflow.selector);
        registry.anchor(ROOT);
    }

    function test_anchor_acceptsLargest48BitClock() public {
        uint256 max48 = (uint256(1) << 48) - 1;
        vm.warp(max48);
        vm.roll(max48);
        vm.prank(alice);
        registry.anchor(ROOT);
        (uint64 ts, uint64 bn, address by) = registry.anchoredAt(ROOT);
        assertEq(ts, max48);
        assertEq(bn, max48);
        assertEq(by, alice);
    }

    // ------------------------------------------------------------------ storage shape

    function test_anchor_writesExactlyOneSlotWithDocumentedLayout() public {
        vm.record();
        vm.prank(alice);
        registry.anchor(ROOT);
        (, bytes32[] memory writes) = vm.accesses(address(registry));
        assertEq(writes.length, 1, "one SSTORE per anchor");
        assertEq(writes[0], _slot(ROOT));

        uint256 word = uint256(vm.load(address(registry), _slot(ROOT)));
        assertEq(address(uint160(word)), alice, "bits 0..159: by");
        assertEq((word >> 160) & ((1 << 48) - 1), 1_700_000_000, "bits 160..207: timestamp");
        assertEq(word >> 208, 19_000_000, "bits 208..255: block number");
        assertEq(vm.load(address(registry), bytes32(uint256(_slot(ROOT)) + 1)), bytes32(0), "no second slot");
    }

    function test_noAdminSurface() public {
        // Write-once registry: nothing but anchor() changes state. Typical admin selectors must not exist.
        bytes4[6] memory sels = [
            bytes4(keccak256("owner()")),
            bytes4(keccak256("transferOwnership(address)")),
            bytes4(keccak256("pause()")),
            bytes4(keccak256("upgradeTo(address)")),
            bytes4(keccak256("upgradeToAndCall(address,bytes)")),
            bytes4(keccak256("renounceOwnership()"))
        ];
        for (uint256 i = 0; i < sels.length; i++) {
            (bool ok,) = address(registry).call(abi.encodePacked(sels[i], bytes32(0)));
            assertFalse(ok);
        }
        (bool sent,) = address(registry).call{value: 1}("");
        assertFalse(sent, "no receive/fallback");
    }

    // ------------------------------------------------------------------ fuzz

    function testFuzz_writeOnceUnderAnyRoot(bytes32 root, address first, address second, uint48 t1, uint48 b1)
        public
    {
        vm.assume(root != bytes32(0));
        vm.assume(first != address(0));
        vm.warp(t1);
        vm.roll(b1);
        vm.prank(first);
        registry.anchor(root);

        vm.warp(uint256(t1) + 1);
        vm.roll(uint256(b1) + 1);
        vm.prank(second);
        vm.expectRevert(abi.encodeWithSelector(Registry.AlreadyAnchored.selector, root));
        registry.anchor(root);

        (uint64 ts, uint64 bn, address by) = registry.anchoredAt(root);
        assertEq(ts, t1);
        assertEq(bn, b1);
        assertEq(by, first);
        assertTrue(registry.isAnchored(root));
    }

    function testFuzz_rootsAreIndependent(bytes32 a, bytes32 b) public {
        vm.assume(a != bytes32(0) && b != bytes32(0) && a != b);
        vm.prank(alice);
        registry.anchor(a);
        assertFalse(registry.isAnchored(b));
        vm.warp(block.timestamp + 12);
        vm.prank(bob);
        registry.anchor(b);
        (uint64 tsA,, address byA) = registry.anchoredAt(a);
        (uint64 tsB,, address byB) = registry.anchoredAt(b);
        assertEq(byA, alice);
        assertEq(byB, bob);
        assertEq(tsB, tsA + 12);
    }

    function testFuzz_clockOverflowAlwaysReverts(uint256 ts, uint256 bn) public {
        ts = bound(ts, 0, type(uint64).max);
        bn = bound(bn, 0, type(uint64).max);
        vm.assume(ts >= (1 << 48) || bn >= (1 << 48));
        vm.warp(ts);
        vm.roll(bn);
        vm.expectRevert(Registry.ClockOverflow.selector);
        registry.anchor(ROOT);
    }
}
