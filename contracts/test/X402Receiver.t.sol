// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {X402Receiver, IEIP3009Token} from "../src/X402Receiver.sol";
import {TestUSDC} from "../src/TestUSDC.sol";
import {Eip3009Helper} from "./utils/Eip3009Helper.sol";
import {MockToken, ReentrantToken, MockERC1271Wallet} from "./utils/Mocks.sol";

contract X402ReceiverTest is Eip3009Helper {
    event PaymentRecorded(bytes32 indexed paymentId, address indexed payer, uint256 amount);
    event Withdrawn(address indexed to, uint256 amount);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    event Transfer(address indexed from, address indexed to, uint256 value);

    TestUSDC internal usdc;
    X402Receiver internal receiver;
    bytes32 internal domain;

    address internal beneficiary = makeAddr("beneficiary");
    address internal settler = makeAddr("settler");
    address internal stranger = makeAddr("stranger");
    address internal bob = makeAddr("bob");
    uint256 internal constant PAYER_PK = 0xC0FFEE;
    address internal payer;
    uint256 internal constant NOW = 1_700_000_000;
    bytes32 internal constant ID = keccak256("payment-1");

    function setUp() public {
        vm.warp(NOW);
        usdc = new TestUSDC("USD Coin", "2");
        receiver = new X402Receiver(IEIP3009Token(address(usdc)), beneficiary, settler);
        domain = _domain(address(usdc), "USD Coin", "2", block.chainid);
        payer = vm.addr(PAYER_PK);
        usdc.mint(payer, 100e6);
    }

    function _auth(uint256 value, bytes32 nonce) internal view returns (Auth memory) {
        return Auth(payer, address(receiver), value, NOW - 1, NOW + 60, nonce);
    }

    function _sig(bytes32 typehash, Auth memory a) internal view returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(PAYER_PK, _authDigest(domain, typehash, a));
        return _pack(v, r, s);
    }

    function _settle(bytes32 id, Auth memory a, bytes memory sig) internal {
        receiver.settleAndRecord(id, a.from, a.value, a.validAfter, a.validBefore, a.nonce, sig);
    }

    function _settleTransfer(bytes32 id, Auth memory a, bytes memory sig) internal {
        receiver.settleTransferAndRecord(id, a.from, a.value, a.validAfter, a.validBefore, a.nonce, sig);
    }

    function _assertNoRecord(bytes32 id) internal view {
        (address p, uint256 amt) = receiver.payments(id);
        assertEq(p, address(0));
        assertEq(amt, 0);
    }

    // ================================================================== construction

    function test_constructor_setsImmutables() public view {
        assertEq(address(receiver.token()), address(usdc));
        assertEq(receiver.beneficiary(), beneficiary);
        assertEq(receiver.settler(), settler);
    }

    function test_constructor_rejectsZeroAddresses() public {
        vm.expectRevert(X402Receiver.ZeroAddress.selector);
        new X402Receiver(IEIP3009Token(address(0)), beneficiary, settler);
        vm.expectRevert(X402Receiver.ZeroAddress.selector);
        new X402Receiver(IEIP3009Token(address(usdc)), address(0), settler);
        vm.expectRevert(X402Receiver.ZeroAddress.selector);
        new X402Receiver(IEIP3009Token(address(usdc)), beneficiary, address(0));
    }

    function test_constructor_rejectsTokenWithoutCode() public {
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.TokenHasNoCode.selector, stranger));
        new X402Receiver(IEIP3009Token(stranger), beneficiary, settler);
    }

    // ================================================================== recordPayment

    function test_recordPayment_bySettler() public {
        vm.expectEmit(true, true, false, true, address(receiver));
        emit PaymentRecorded(ID, payer, 5e6);
        vm.prank(settler);
        receiver.recordPayment(ID, payer, 5e6);
        (address p, uint256 amt) = receiver.payments(ID);
        assertEq(p, payer);
        assertEq(amt, 5e6);
    }

    function test_recordPayment_byBeneficiary() public {
        vm.prank(beneficiary);
        receiver.recordPayment(ID, payer, 5e6);
        (address p,) = receiver.payments(ID);
        assertEq(p, payer);
    }

    function test_recordPayment_rejectsStranger() public {
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotSettler.selector, stranger));
        receiver.recordPayment(ID, payer, 5e6);
        _assertNoRecord(ID);
    }

    function test_recordPayment_doubleRecordRejected() public {
        vm.startPrank(settler);
        receiver.recordPayment(ID, payer, 5e6);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        receiver.recordPayment(ID, stranger, 7e6);
        vm.stopPrank();
        vm.prank(beneficiary);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        receiver.recordPayment(ID, payer, 5e6);
        (address p, uint256 amt) = receiver.payments(ID);
        assertEq(p, payer);
        assertEq(amt, 5e6);
    }

    function test_recordPayment_rejectsZeroIdZeroPayerAndHugeAmount() public {
        vm.startPrank(settler);
        vm.expectRevert(X402Receiver.ZeroPaymentId.selector);
        receiver.recordPayment(bytes32(0), payer, 1);
        vm.expectRevert(X402Receiver.ZeroAddress.selector);
        receiver.recordPayment(ID, address(0), 1);
        uint256 tooBig = uint256(type(uint96).max) + 1;
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.AmountTooLarge.selector, tooBig));
        receiver.recordPayment(ID, payer, tooBig);
        receiver.recordPayment(ID, payer, type(uint96).max);
        vm.stopPrank();
        (, uint256 amt) = receiver.payments(ID);
        assertEq(amt, type(uint96).max);
    }

    function test_recordPayment_zeroAmountIsARecord() public {
        vm.startPrank(settler);
        receiver.recordPayment(ID, payer, 0);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        receiver.recordPayment(ID, payer, 0);
        vm.stopPrank();
    }

    function test_payments_oneSlotLayout() public {
        vm.record();
        vm.prank(settler);
        receiver.recordPayment(ID, payer, 5e6);
        (, bytes32[] memory writes) = vm.accesses(address(receiver));
        assertEq(writes.length, 1);
        bytes32 slot = keccak256(abi.encode(ID, uint256(0)));
        assertEq(writes[0], slot);
        uint256 word = uint256(vm.load(address(receiver), slot));
        assertEq(address(uint160(word)), payer);
        assertEq(word >> 160, 5e6);
    }

    // ================================================================== settleAndRecord (receiveWithAuthorization)

    function test_settleAndRecord_pullsFundsAndRecords() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        bytes memory sig = _sig(RECEIVE_TYPEHASH, a);

        vm.expectEmit(true, true, false, true, address(receiver));
        emit PaymentRecorded(ID, payer, 2e6);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit AuthorizationUsed(payer, a.nonce);
        vm.expectEmit(true, true, false, true, address(usdc));
        emit Transfer(payer, address(receiver), 2e6);
        vm.prank(settler);
        _settle(ID, a, sig);

        assertEq(usdc.balanceOf(address(receiver)), 2e6);
        assertEq(usdc.balanceOf(payer), 98e6);
        assertTrue(usdc.authorizationState(payer, a.nonce));
        (address p, uint256 amt) = receiver.payments(ID);
        assertEq(p, payer);
        assertEq(amt, 2e6);
    }

    function test_settleAndRecord_byBeneficiary() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        vm.prank(beneficiary);
        _settle(ID, a, _sig(RECEIVE_TYPEHASH, a));
        assertEq(usdc.balanceOf(address(receiver)), 2e6);
    }

    function test_settleAndRecord_rejectsStranger() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        bytes memory sig = _sig(RECEIVE_TYPEHASH, a);
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotSettler.selector, stranger));
        _settle(ID, a, sig);
        // The payer's authorization stays usable by the real settler.
        assertFalse(usdc.authorizationState(payer, a.nonce));
        vm.prank(settler);
        _settle(ID, a, sig);
    }

    function test_settleAndRecord_doubleRecordRejectedAndNoSecondPull() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        vm.prank(settler);
        _settle(ID, a, _sig(RECEIVE_TYPEHASH, a));
        // Same id, fresh valid authorization: rejected before touching the token.
        Auth memory b = _auth(3e6, keccak256("nonce-2"));
        vm.prank(settler);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        _settle(ID, b, _sig(RECEIVE_TYPEHASH, b));
        assertFalse(usdc.authorizationState(payer, b.nonce));
        assertEq(usdc.balanceOf(address(receiver)), 2e6);
    }

    function test_settleAndRecord_replayedAuthorizationUnderNewIdRejected() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        bytes memory sig = _sig(RECEIVE_TYPEHASH, a);
        vm.startPrank(settler);
        _settle(ID, a, sig);
        vm.expectRevert(bytes("FiatTokenV2: authorization is used or canceled"));
        _settle(keccak256("payment-2"), a, sig);
        vm.stopPrank();
        _assertNoRecord(keccak256("payment-2"));
        assertEq(usdc.balanceOf(address(receiver)), 2e6);
    }

    function test_settleAndRecord_failedPullLeavesNoRecord() public {
        vm.startPrank(settler);
        // Bad signature.
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(0xBAD, _authDigest(domain, RECEIVE_TYPEHASH, a));
        vm.expectRevert(bytes("FiatTokenV2: invalid signature"));
        _settle(ID, a, _pack(v, r, s));
        // A TransferWithAuthorization signature is not a ReceiveWithAuthorization one.
        vm.expectRevert(bytes("FiatTokenV2: invalid signature"));
        _settle(ID, a, _sig(TRANSFER_TYPEHASH, a));
        // Signed to someone else (the receiver always passes itself as `to`).
        Auth memory toBob = Auth(payer, bob, 2e6, NOW - 1, NOW + 60, keccak256("nonce-1"));
        vm.expectRevert(bytes("FiatTokenV2: invalid signature"));
        _settle(ID, a, _sig(RECEIVE_TYPEHASH, toBob));
        // Expired.
        bytes memory good = _sig(RECEIVE_TYPEHASH, a);
        vm.warp(a.validBefore);
        vm.expectRevert(bytes("FiatTokenV2: authorization is expired"));
        _settle(ID, a, good);
        // Payer short of funds.
        vm.warp(NOW);
        Auth memory big = _auth(101e6, keccak256("nonce-3"));
        vm.expectRevert(bytes("ERC20: transfer amount exceeds balance"));
        _settle(ID, big, _sig(RECEIVE_TYPEHASH, big));
        vm.stopPrank();
        _assertNoRecord(ID);
        assertEq(usdc.balanceOf(address(receiver)), 0);
    }

    function test_settleAndRecord_contractWalletPayer() public {
        uint256 ownerPk = 0x0A11;
        MockERC1271Wallet wallet = new MockERC1271Wallet(vm.addr(ownerPk));
        usdc.mint(address(wallet), 10e6);
        Auth memory a = Auth(address(wallet), address(receiver), 4e6, NOW - 1, NOW + 60, keccak256("w"));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(ownerPk, _authDigest(domain, RECEIVE_TYPEHASH, a));
        vm.prank(settler);
        _settle(ID, a, _pack(v, r, s));
        (address p, uint256 amt) = receiver.payments(ID);
        assertEq(p, address(wallet));
        assertEq(amt, 4e6);
    }

    // ================================================================== settleTransferAndRecord (standard x402 payload)

    function test_settleTransferAndRecord_pullsFundsAndRecords() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        vm.expectEmit(true, true, false, true, address(receiver));
        emit PaymentRecorded(ID, payer, 2e6);
        vm.prank(settler);
        _settleTransfer(ID, a, _sig(TRANSFER_TYPEHASH, a));
        assertEq(usdc.balanceOf(address(receiver)), 2e6);
        (address p, uint256 amt) = receiver.payments(ID);
        assertEq(p, payer);
        assertEq(amt, 2e6);
    }

    function test_settleTransferAndRecord_rejections() public {
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        bytes memory sig = _sig(TRANSFER_TYPEHASH, a);
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotSettler.selector, stranger));
        _settleTransfer(ID, a, sig);

        vm.startPrank(settler);
        // Signed with to = bob: the receiver always passes itself as `to`, so the signature fails.
        Auth memory toBob = Auth(payer, bob, 2e6, NOW - 1, NOW + 60, keccak256("nonce-1"));
        vm.expectRevert(bytes("FiatTokenV2: invalid signature"));
        _settleTransfer(ID, a, _sig(TRANSFER_TYPEHASH, toBob));
        _settleTransfer(ID, a, sig);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        _settleTransfer(ID, a, sig);
        vm.expectRevert(bytes("FiatTokenV2: authorization is used or canceled"));
        _settleTransfer(keccak256("payment-2"), a, sig);
        vm.stopPrank();
        _assertNoRecord(keccak256("payment-2"));
    }

    function test_settleTransferAndRecord_frontRunThenAttest() public {
        // Someone submits the x402 payload to the token directly: money arrives, settle then fails,
        // and the settler attests the payment instead (documented fallback).
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        bytes memory sig = _sig(TRANSFER_TYPEHASH, a);
        vm.prank(stranger);
        usdc.transferWithAuthorization(a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce, sig);
        assertEq(usdc.balanceOf(address(receiver)), 2e6);
        vm.startPrank(settler);
        vm.expectRevert(bytes("FiatTokenV2: authorization is used or canceled"));
        _settleTransfer(ID, a, sig);
        receiver.recordPayment(ID, payer, 2e6);
        vm.stopPrank();
        (address p,) = receiver.payments(ID);
        assertEq(p, payer);
    }

    function test_idsShareOneNamespaceAcrossAllRecordPaths() public {
        vm.prank(settler);
        receiver.recordPayment(ID, payer, 1);
        Auth memory a = _auth(2e6, keccak256("nonce-1"));
        vm.startPrank(settler);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        _settle(ID, a, _sig(RECEIVE_TYPEHASH, a));
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, ID));
        _settleTransfer(ID, a, _sig(TRANSFER_TYPEHASH, a));
        vm.stopPrank();
    }

    function test_settle_reentrancyWithSameIdRejected() public {
        ReentrantToken evil = new ReentrantToken();
        // The token itself is the settler here, the worst case for re-entrancy.
        X402Receiver r = new X402Receiver(IEIP3009Token(address(evil)), beneficiary, address(evil));
        evil.arm(
            address(r),
            abi.encodeCall(X402Receiver.settleAndRecord, (ID, payer, 1, 0, type(uint256).max, bytes32(0), ""))
        );
        vm.prank(address(evil));
        r.settleAndRecord(ID, payer, 1, 0, type(uint256).max, bytes32(0), "");
        assertTrue(evil.reentered());
        assertFalse(evil.reentrySucceeded(), "re-entrant settle with the same id must fail");
    }

    // ================================================================== withdraw

    function _fund(uint256 amount) internal {
        Auth memory a = _auth(amount, keccak256(abi.encode("fund", amount)));
        vm.prank(settler);
        _settle(keccak256(abi.encode("fund-id", amount)), a, _sig(RECEIVE_TYPEHASH, a));
    }

    function test_withdraw_byBeneficiary() public {
        _fund(10e6);
        vm.expectEmit(true, false, false, true, address(receiver));
        emit Withdrawn(bob, 4e6);
        vm.prank(beneficiary);
        receiver.withdraw(bob, 4e6);
        assertEq(usdc.balanceOf(bob), 4e6);
        assertEq(usdc.balanceOf(address(receiver)), 6e6);
    }

    function test_withdraw_rejectsSettlerAndStranger() public {
        _fund(10e6);
        vm.prank(settler);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotBeneficiary.selector, settler));
        receiver.withdraw(settler, 1);
        vm.prank(stranger);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotBeneficiary.selector, stranger));
        receiver.withdraw(stranger, 1);
        assertEq(usdc.balanceOf(address(receiver)), 10e6);
    }

    function test_withdraw_rejectsZeroRecipient() public {
        _fund(10e6);
        vm.prank(beneficiary);
        vm.expectRevert(X402Receiver.ZeroAddress.selector);
        receiver.withdraw(address(0), 1);
    }

    function test_withdraw_moreThanBalanceReverts() public {
        _fund(10e6);
        vm.prank(beneficiary);
        vm.expectRevert(X402Receiver.TransferFailed.selector);
        receiver.withdraw(bob, 10e6 + 1);
    }

    function test_withdraw_safeTransferVariants() public {
        MockToken t = new MockToken();
        X402Receiver r = new X402Receiver(IEIP3009Token(address(t)), beneficiary, settler);
        t.mint(address(r), 100);
        vm.startPrank(beneficiary);

        t.setMode(MockToken.Mode.ReturnsTrue);
        r.withdraw(bob, 10);
        assertEq(t.balanceOf(bob), 10);

        t.setMode(MockToken.Mode.ReturnsNothing); // USDT-style
        r.withdraw(bob, 10);
        assertEq(t.balanceOf(bob), 20);

        t.setMode(MockToken.Mode.ReturnsFalse);
        vm.expectRevert(X402Receiver.TransferFailed.selector);
        r.withdraw(bob, 10);

        t.setMode(MockToken.Mode.Reverts);
        vm.expectRevert(X402Receiver.TransferFailed.selector);
        r.withdraw(bob, 10);

        t.setMode(MockToken.Mode.ReturnsGarbage);
        vm.expectRevert(X402Receiver.TransferFailed.selector);
        r.withdraw(bob, 10);
        vm.stopPrank();
        assertEq(t.balanceOf(bob), 20);
    }

    function test_noEtherAccepted() public {
        vm.deal(address(this), 1 ether);
        (bool ok,) = address(receiver).call{value: 1}("");
        assertFalse(ok);
    }

    // ================================================================== fuzz

    function testFuzz_onlyBeneficiaryWithdraws(address caller, uint256 amount) public {
        _fund(10e6);
        amount = bound(amount, 0, 10e6);
        if (caller != beneficiary) {
            vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotBeneficiary.selector, caller));
        }
        vm.prank(caller);
        receiver.withdraw(bob, amount);
        assertEq(usdc.balanceOf(bob), caller == beneficiary ? amount : 0);
    }

    function testFuzz_onlySettlerOrBeneficiaryRecords(address caller, bytes32 id, address p, uint96 amount)
        public
    {
        vm.assume(id != bytes32(0) && p != address(0));
        bool allowed = caller == settler || caller == beneficiary;
        if (!allowed) vm.expectRevert(abi.encodeWithSelector(X402Receiver.NotSettler.selector, caller));
        vm.prank(caller);
        receiver.recordPayment(id, p, amount);
        (address got, uint256 amt) = receiver.payments(id);
        assertEq(got, allowed ? p : address(0));
        assertEq(amt, allowed ? amount : 0);
    }

    function testFuzz_doubleRecordRejected(
        bytes32 id,
        address p1,
        address p2,
        uint96 a1,
        uint96 a2,
        bool viaSettle
    ) public {
        vm.assume(id != bytes32(0) && p1 != address(0) && p2 != address(0));
        vm.startPrank(settler);
        receiver.recordPayment(id, p1, a1);
        vm.expectRevert(abi.encodeWithSelector(X402Receiver.PaymentAlreadyRecorded.selector, id));
        if (viaSettle) {
            Auth memory a = _auth(1e6, keccak256(abi.encode(id)));
            _settle(id, a, _sig(RECEIVE_TYPEHASH, a));
        } else {
            receiver.recordPayment(id, p2, a2);
        }
        vm.stopPrank();
        (address got, uint256 amt) = receiver.payments(id);
        assertEq(got, p1);
        assertEq(amt, a1);
    }

    function testFuzz_settleRecordsExactlyWhatMoved(bytes32 id, uint256 value, bytes32 nonce) public {
        vm.assume(id != bytes32(0));
        value = bound(value, 0, 100e6);
        Auth memory a = _auth(value, nonce);
        vm.prank(settler);
        _settle(id, a, _sig(RECEIVE_TYPEHASH, a));
        (address p, uint256 amt) = receiver.payments(id);
        assertEq(p, payer);
        assertEq(amt, value);
        assertEq(usdc.balanceOf(address(receiver)), value);
        assertEq(usdc.balanceOf(payer), 100e6 - value);
    }
}
